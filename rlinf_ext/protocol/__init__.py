"""The types at the seams between packages (no models, no Ray workers): the generation contract and its channel
form (``generation``), RLinf channel payloads (``payloads``), channel names (``channels``), metric names
(``metric_keys``), images as content-addressed canonical PNGs (``images``) and Qwen2.5-VL token facts
(``vl_tokens``)."""
