"""What the agents share: trajectory and turn types, the response buffer and its mask invariant, the rollout
contract of the agent-loop worker (``rollout.py``), the results handed to the trainer."""
