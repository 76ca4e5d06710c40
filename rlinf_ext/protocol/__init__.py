"""The types at the seams between packages (no models, no Ray workers): the generation contract and its channel
form (``generation``), RLinf channel payloads (``payloads``), channel names (``channels``) and metric names
(``metric_keys``)."""
