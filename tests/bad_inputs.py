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
