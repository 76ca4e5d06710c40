"""The agent loops. ``registry`` maps ``agentloop.agent`` to an agent's package (``searchr1/``, ``mmsearch/``);
``core/`` holds what both share. Nothing is imported here: config validation imports the registry and the
protocols without the loops."""
