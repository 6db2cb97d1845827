"""Write a copy of a GGUF with the tensors of some ggml types requantized to another (a diagnostic).

Used to find which weight type's batched matmul breaks one-row/batch bit-identity: requantize,
say, every Q8_0 tensor to Q5_1 (a type no tinyBLAS kernel takes, so one-row and batched products
both run ggml's vec_dot) and run row_identity.py on the copy. The copy is a different model
(requantized weights); only its identity result means anything.

    python -m benchmarks.kernels.retype IN.gguf OUT.gguf --from Q8_0[,Q5_0] --to Q5_1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def retype(src: str, dst: str, from_types: set[str], to_type: str) -> dict[str, int]:
    """Copy src to dst, requantizing tensors whose type is in from_types; returns counts changed."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType, quants

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    target = GGMLQuantizationType[to_type]
    changed: dict[str, int] = {}
    for t in reader.tensors:
        qtype = GGMLQuantizationType(t.tensor_type)
        ne = [int(x) for x in t.shape]  # ggml order
        if qtype.name in from_types:
            f32 = quants.dequantize(t.data, qtype).reshape(list(reversed(ne)))
            data = quants.quantize(f32.astype(np.float32), target)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=target)
            changed[qtype.name] = changed.get(qtype.name, 0) + 1
        else:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--from", dest="from_types", required=True, help="comma-separated ggml type names")
    ap.add_argument("--to", dest="to_type", required=True)
    args = ap.parse_args(argv)
    print(retype(args.src, args.dst, set(args.from_types.split(",")), args.to_type))
    return 0


if __name__ == "__main__":
    sys.exit(main())
