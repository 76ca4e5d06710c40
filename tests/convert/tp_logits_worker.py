"""One TP rank of Megatron-core GPTModels on gloo: for each case loads its shard and writes full logits (rank 0).

Run by test_convert_logits.py as
``python tp_logits_worker.py RANK WORLD PORT BATCH MG_DIR HF_DIR OUT [MG_DIR HF_DIR OUT ...]``.
"""

import os
import sys

import torch

from rlinf_ext.convert.mg_checkpoint import discover_ranks, load_rank_file, resolve_iteration_dir
from rlinf_ext.models.cpu_shims import parallel_state_session
from rlinf_ext.models.megatron import build_gpt_model, forward_logits, load_megatron_state_dict


def main(rank: int, world: int, port: int, batch_path: str, cases: list[str]) -> None:
    torch.set_num_threads(1)
    batch = torch.load(batch_path)
    with parallel_state_session(world, 1, rank=rank, init_method=f"tcp://127.0.0.1:{port}", timeout_s=120):
        for mg_dir, hf_dir, out_path in zip(cases[0::3], cases[1::3], cases[2::3]):
            model = build_gpt_model(hf_dir, init_weights=False)
            layout = discover_ranks(resolve_iteration_dir(mg_dir))  # the converters' reader (convert/mg2hf.py)
            assert (layout.tp, layout.pp) == (world, 1), (mg_dir, layout.tp, layout.pp)
            state = load_rank_file(layout.rank_file(rank, 0))
            load_megatron_state_dict(model, state, source=f"{mg_dir} tp rank {rank}")
            logits = forward_logits(model, batch["ids"], attention_mask=batch["mask"])
            if rank == 0:
                torch.save(logits, out_path)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4:])
    sys.stdout.flush()
    os._exit(0)  # no teardown of the Megatron/transformers stack
