"""Composition of a run from its YAML: the launcher (``launch``), the per-step metrics sink (``metrics``), the
``train``/``eval`` CLI verbs (``commands``), the RLinf worker groups (``groups``) and the GRPO runner
(``trainer``). Nothing is imported here so that ``rlinf-ext --help`` stays instant."""
