"""Search-R1: the text agent (`<search>` / `<information>` / `<answer>`): its turn protocol, loop and rollout."""
