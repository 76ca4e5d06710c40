"""Offline tiny assets: agent-independent parts in ``core``, each agent's world, data and warm start in its own package."""
