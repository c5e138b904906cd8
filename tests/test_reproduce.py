"""`kvcargo reproduce`: every published figure (the chapter, spec §8.2–§8.6) matches."""

from __future__ import annotations

import pytest

from kvcargo import reproduce


def test_every_published_figure_is_reproduced() -> None:
    checks = reproduce.run()
    bad = [(c.what, c.published, c.kvcargo) for c in checks if not c.ok]
    assert not bad, bad
    assert len(checks) >= 700
    assert sum(c.exact for c in checks) >= 190  # the full-precision values of §8.5, bit for bit


@pytest.mark.parametrize("published, value, ok, shown", [
    ("353.6 ms", 0.3536255769527793, True, "353.6 ms"),
    ("353.6 ms", 0.35375, False, "353.8 ms"),
    ("9,657.8 ms", 9.657760737543722, True, "9657.8 ms"),
    ("64.4%", 0.6438583629251369, True, "64.4%"),
    ("47.1 s", 47.14589601504739, True, "47.1 s"),
    ("$678", 678.26, True, "678"),
    ("0.326", 0.3256000575459429, True, "0.326"),
])
def test_printed_values_compare_to_their_digits(published: str, value: float, ok: bool, shown: str) -> None:
    assert reproduce.compare(published, value) == (ok, shown)


def test_exact_values_compare_bit_for_bit() -> None:
    assert reproduce.compare("0.1", 0.1, 0.1) == (True, "0.1")
    assert reproduce.compare("0.1", 0.1 + 1e-17 * 2, 0.1)[0] is False
