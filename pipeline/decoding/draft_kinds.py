"""Every built-in proposer, registered by the verify kind it drafts, and the lookup the loop and
replay use. A kind of your own registers its proposer when its module is imported (the grid file
names it by import path)."""
from __future__ import annotations

from pipeline.decoding.draft import PROPOSERS, CandidateProposer, ChainProposer
from pipeline.decoding.draft_dynamic import DynamicTreeProposer
from pipeline.decoding.draft_shapes import BanditTreeProposer, ShapeTreeProposer
from pipeline.decoding.verify_kinds import VerifySpec

BUILT_IN = (ChainProposer, CandidateProposer, DynamicTreeProposer, ShapeTreeProposer, BanditTreeProposer)


def proposer_class(verify: VerifySpec) -> type[ChainProposer]:
    """The proposer registered for a verify kind."""
    if verify.kind not in PROPOSERS:
        raise ValueError(f"no proposer drafts verify kind {verify.kind!r}: define one beside it, "
                         f"class MyProposer(ChainProposer, kind={verify.kind!r})")
    return PROPOSERS[verify.kind]
