"""How the report reads a run's rows: each output as a digest (equal exactly when the ids are),
and list columns whose values repeat as one shared tuple per value."""
from __future__ import annotations

import random

import pyarrow as pa

from pipeline.reports.report_rows import _interned, output_digest


def test_an_output_digest_is_equal_exactly_when_the_ids_are():
    rng = random.Random(0)
    lists = [[rng.randrange(5) for _ in range(rng.randrange(6))] for _ in range(400)] + [None, [], [0], [0, 0]]
    lists += [[1, 2, 3], [3, 2, 1], [2, 1, 3], [1, 2, 3, 0]]  # orders and a trailing zero
    array = pa.array(lists, pa.list_(pa.int32()))
    digests = output_digest(array.slice(1)).to_pylist()  # a slice: offsets not starting at 0
    for a, da in zip(lists[1:], digests):
        assert (da is None) == (a is None)
    seen = {}
    for ids, digest in zip(lists[1:], digests):
        if ids is not None:
            assert seen.setdefault(digest, tuple(ids)) == tuple(ids)
    assert len(seen) == len({tuple(ids) for ids in lists[1:] if ids is not None})


def test_repeated_list_values_are_read_as_one_tuple_each_across_parts_and_nulls():
    """verify_shapes-like values (lists of lists) and image notes (lists of strings), in two
    scanned parts with nulls (the strings met in another order in each): each row reads as its
    value, and equal values are one object."""
    nested = pa.list_(pa.list_(pa.int32()))
    shapes = pa.chunked_array([pa.array([[[1, 2], [3]], None, [[1, 2], [3]], [], [[]], [[3], [1, 2]]], nested),
                               pa.array([None, [[]], [], [[1, 2], [3]]], nested)])
    notes = pa.chunked_array([pa.array([[], ["x"], None, [""], ["x", "y"]], pa.list_(pa.string())),
                              pa.array([["y"], [""], None, ["x"], ["y", "x"]], pa.list_(pa.string()))])
    for column in (shapes, notes):
        read = _interned(column)
        expected = column.to_pylist()
        frozen = lambda v: v if v is None else tuple(frozen(x) if isinstance(x, list) else x for x in v)
        assert list(read) == [frozen(v) for v in expected]
        values = [v for v in read if v is not None]
        assert all((a is b) == (a == b) for a in values for b in values)
