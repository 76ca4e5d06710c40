"""MMSearch-R1: the vision-language agent (answer from the image, image search, text search): its turn protocol,
loop, prompts, observations, metrics and rollout."""
