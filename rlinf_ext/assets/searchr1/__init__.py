"""Search-R1 (text agent) tiny assets: questions and QA rows, planned trajectories, the warm start and its evaluation."""
