"""Agent-independent parts of the agent loops: trajectory types, the `agentloop` settings, scripted engines for
tests, reward scoring of a trajectory."""
