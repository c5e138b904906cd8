"""Input files for the bad-input corpus (tests/test_bad_inputs.py): broken catalogs and traces."""

from __future__ import annotations

from pathlib import Path

TEXT_FILES = {
    "badmodel": ("m.toml", '[models.bad]\nname = "bad"\nlayers = 2\nd_model = 64\nheads = 8\nkv_heads = 3\n'
                           "d_ff = 128\nvocab = 100\n"),
    "badtoml": ("b.toml", "[models.x\nname = 1\n"),
    "unknownkind": ("k.toml", "[gizmos.x]\nname = 'x'\n"),
    "badfield": ("f.toml", '[links.x]\nname = "x"\nbandwidth = -1\nlatency = 0\npj_per_bit = 1\n'),
    "badtrace": ("t.csv", "foo,bar\n1,2\n"),
    "emptytrace": ("e.csv", ""),
    "hugeprompt": ("h.csv", "arrival,prompt_len,output_len\n0,100000000000,10\n"),
    "negarrival": ("n.csv", "arrival,prompt_len,output_len\n-1,10,10\n"),
    "zerolen": ("z.csv", "arrival,prompt_len,output_len\n0,0,10\n"),
    "farfuture": ("far.csv", "arrival,prompt_len,output_len\n0,10,10\n1e12,10,10\n"),
    "int64prompt": ("i.csv", "arrival,prompt_len,output_len\n0,9223372036854775808,10\n"),
    "bighash": ("bh.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1, 99999999999999999999]}\n'),
    "hugeoutput": ("o.csv", "arrival,prompt_len,output_len\n0,10,10\n1,10,1000000000000\n"),
    "sametime": ("s.csv", "arrival,prompt_len,output_len\n0,10,10\n0,10,10\n"),
    "deepjson": ("d.json", "[" * 100_000),
    "deeptoml": ("d.toml", "a = " + "[" * 100_000),
}


def make_fixtures(root: Path) -> dict[str, str]:
    """Write the input files under ``root/in``; return their paths by name, plus ``dirpath`` (a
    directory where a file is expected) and ``tmp`` (an empty output directory, ``root/out``)."""
    inputs = root / "in"
    inputs.mkdir()
    paths = {}
    for key, (name, text) in TEXT_FILES.items():
        (inputs / name).write_text(text, encoding="utf-8")
        paths[key] = str(inputs / name)
    (inputs / "bin.csv").write_bytes(bytes(range(256)) * 4)
    paths["binary"] = str(inputs / "bin.csv")
    (inputs / "adir").mkdir()
    paths["dirpath"] = str(inputs / "adir")
    (root / "out").mkdir()
    paths["tmp"] = str(root / "out")
    return paths
