"""Actor -> rollout weight sync (``weight_sync``): routes, messages, bucket packing and the post-sync check, used by
the actor and rollout workers on both sides (torch only, no RLinf)."""
