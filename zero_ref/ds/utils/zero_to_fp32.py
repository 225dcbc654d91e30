"""Consolidate a zero_ref checkpoint into one fp32 state dict, as DeepSpeed's zero_to_fp32.py does.

    python -m zero_ref.ds.utils.zero_to_fp32 CHECKPOINT_DIR OUTPUT_FILE [--tag T] [--exclude-frozen-parameters]

The command line only: the format and the consolidation live in ``zero_ref.checkpoint.format``.
"""
from __future__ import annotations

import argparse
import json
import os

from zero_ref.checkpoint.format import (META, CheckpointError, Reader, convert_zero_checkpoint_to_fp32_state_dict,
                                        get_fp32_state_dict_from_zero_checkpoint, load_state_dict_from_zero_checkpoint,
                                        resolve)

__all__ = ["main", "get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "load_state_dict_from_zero_checkpoint", "CheckpointError", "Reader"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m zero_ref.ds.utils.zero_to_fp32", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint_dir", help="the folder that holds 'latest' and the tag folders (save_checkpoint's dir)")
    ap.add_argument("output_file", help="where to write the fp32 state dict (torch.save; .safetensors if so named)")
    ap.add_argument("--tag", default=None, help="checkpoint tag (default: the one named in 'latest')")
    ap.add_argument("--exclude-frozen-parameters", action="store_true")
    args = ap.parse_args(argv)
    try:
        state = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_file, args.tag,
                                                           args.exclude_frozen_parameters)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    with open(os.path.join(resolve(args.checkpoint_dir, args.tag), META)) as f:
        meta = json.load(f)
    unique = {t.data_ptr(): t for t in state.values()}.values()
    print(f"read stage {meta['stage']}, {meta['world_size']} rank(s), step {meta['global_steps']}; wrote {len(state)} "
          f"tensors, {sum(t.numel() for t in unique)} elements, {sum(t.numel() * t.element_size() for t in unique)} "
          f"bytes to {args.output_file}")


if __name__ == "__main__":
    main()
