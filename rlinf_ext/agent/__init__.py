"""The agent loops, one package per agent (``searchr1/``, ``mmsearch/``; ``protocol/agents.py`` maps
``agentloop.agent`` to one); ``core/`` holds what they share. Nothing is imported here: config validation imports
an agent's config section and rules without its loop."""
