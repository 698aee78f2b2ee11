"""Model names a grid may use, checked without loading anything: hub ids, local directories
(whose config.json says the model class), `tiny:` and `embedded:` models, and head drafts.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pipeline.models.families import (
    FAMILIES, TEXT_DRAFTS, TINY_FAMILIES, UnsupportedFamily, check_family, check_role, drafts_only,
)
from pipeline.models.head_names import (
    EMBEDDED_HEADS, HEAD_KINDS, TINY_HEADS, HeadMismatch, check_head, head_kind, head_path,
)
from pipeline.models.lookup_names import (
    LookupNameError, lookup_name, lookup_spec, mixed_parts, model_of, reads_target,
)
from pipeline.names import did_you_mean
from pipeline.planning.draft_entries import draft_entry
from pipeline.planning.grid import TINY_PREFIX, GridError, Pair

TINY_MODELS = ("target", "draft", "next_target", "bigram_target", "mamba_draft", "mamba2_draft",
               *(f"{family}_{role}" for family in TINY_FAMILIES
                 for role in ("target", "draft", "bigram_target")),
               "gemma3_text_draft", *TINY_HEADS)
EMBEDDED_MODELS = ("embedded:target", "embedded:draft", "embedded:small_draft", "embedded:ssm_draft",
                   *EMBEDDED_HEADS)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# Hub ids of families whose drafting methods are limited (P; M for text-only drafts),
# recognised without their config; the first that matches names the family.
FAMILY_HUB_NAMES = {"llava_next": re.compile(r"llava-v1\.6|llava-next|llava_next", re.IGNORECASE),
                    "qwen2_5_vl": re.compile(r"qwen2\.5-vl", re.IGNORECASE),
                    "qwen3_vl": re.compile(r"qwen3-vl", re.IGNORECASE),
                    "internvl": re.compile(r"internvl", re.IGNORECASE),
                    "gemma3_text": re.compile(r"gemma-3-(1b|270m)", re.IGNORECASE),  # before gemma3
                    "gemma3": re.compile(r"gemma-3", re.IGNORECASE)}
HUB_TIMEOUT_S = 10.0  # a metadata request for a hub id's config, before Ray starts


def model_kind(name: str) -> str:
    """A model's `model_type` where it is known without loading it (a local config, a `tiny:`
    name, a LLaVA-NeXT, Qwen2.5-VL, Qwen3-VL, InternVL or Gemma 3 hub id), else `other`."""
    name = model_of(name)  # beside a lookup, the draft model
    tiny = name[len(TINY_PREFIX):].rsplit("_", 1)[0] if name.startswith(TINY_PREFIX) else None
    if name == f"{TINY_PREFIX}next_target":
        return "llava_next"
    if tiny in FAMILIES or tiny in TEXT_DRAFTS:
        return tiny
    for family, hub_name in FAMILY_HUB_NAMES.items():
        if hub_name.search(name):
            return family
    return (_json_file(Path(name) / "config.json") or {}).get("model_type", "other")


def _json_file(path: Path) -> dict | None:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _cached_file(name: str, filename: str) -> Path | None:
    """A file of hub id `name` in this machine's hub cache, when it is there (nothing is downloaded)."""
    if not HUB_ID.fullmatch(name):
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, filename)
    return Path(cached) if isinstance(cached, str) else None


def check_model_id(name: Any, where: str) -> str:
    """A model is a hub id `org/name`, an existing local directory, `embedded:target|draft|small_draft`,
    a `tiny:` model (`TINY_MODELS`) or, as a draft, a head `<kind>:<hub id or directory>`
    (`pipeline.models.head_names`; a grid file may write `{head: <kind>, path: ...}`) or a
    draft-free lookup, `pld` or `pld(<name>=<int>,...)` (`pipeline.models.lookup_names`; a grid
    file may write `{lookup: pld, <name>: <int>}`), or both side by side, `<draft>+<lookup>`
    (`[<draft>, <lookup>]`), returned in its canonical name (`pipeline.planning.draft_entries`)."""
    if where.endswith(".draft"):
        name = draft_entry(name, where, check_model_id)
    try:
        lookup = lookup_spec(name)
    except LookupNameError as err:
        raise GridError(f"{where}: {err}") from None
    if not isinstance(name, str) or not name:
        raise GridError(f"{where}: a model must be a non-empty string, got {name!r}")
    if mixed_parts(name) is not None:
        return name
    if lookup is not None:
        if not where.endswith(".draft"):
            raise GridError(f"{where}: {name!r} is a draft-free lookup: it drafts, it is never a target")
        return lookup_name(*lookup)
    kind, _, path = name.partition(":")
    if kind in HEAD_KINDS:
        if not where.endswith(".draft"):
            raise GridError(f"{where}: {name!r} is a {kind} head: a head drafts, it is never a target")
        check_model_id(path, f"{where} (the {kind} head's files)")
        return name
    if name.startswith("embedded:"):
        if name not in EMBEDDED_MODELS:
            raise GridError(f"{where}: unknown embedded model {name!r}{did_you_mean(name, EMBEDDED_MODELS)}; "
                            f"known: {list(EMBEDDED_MODELS)}")
        return name
    if name.startswith(TINY_PREFIX):
        if name[len(TINY_PREFIX):] not in TINY_MODELS:
            known = [TINY_PREFIX + m for m in TINY_MODELS]
            raise GridError(f"{where}: unknown tiny model {name!r}{did_you_mean(name, known)}; "
                            f"known: {known}")
        return name
    if Path(name).expanduser().is_dir():
        if not (Path(name).expanduser() / "config.json").is_file():
            raise GridError(f"{where}: directory {name!r} is not a model (it has no config.json)")
        return name
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") != 1
    if looks_local or not HUB_ID.fullmatch(name):
        raise GridError(
            f"{where}: {name!r} is neither an existing local directory nor a hub id 'org/name' "
            f"(nor {'|'.join(EMBEDDED_MODELS)}, tiny:{'|'.join(TINY_MODELS)})"
        )
    return name


def check_head_here(target: str, draft: str, where: str) -> None:
    """A head drafts only for the target it reads: a tiny head for the tiny model it was built
    for; another, where both configs are readable here (local directories, cached hub ids),
    one of the same hidden size and vocabulary (`check_head`). Before any weight loads."""
    draft = model_of(draft)  # beside a lookup, the head
    kind = head_kind(draft)
    if kind is None:
        return
    built_for = EMBEDDED_HEADS[draft][1] if draft in EMBEDDED_HEADS else None
    if draft.startswith(TINY_PREFIX):
        built_for = TINY_PREFIX + TINY_HEADS[draft[len(TINY_PREFIX):]][1]
    if built_for is not None:
        if target != built_for:
            raise GridError(f"{where}: {draft} drafts for {built_for}, the model it was built to read, "
                            f"not for {target}")
        return
    head_config, target_config = readable_config(head_path(draft)), readable_config(target)
    if head_config is not None and target_config is not None:
        try:
            check_head(kind, head_config, target_config, head_path(draft), target)
        except HeadMismatch as err:
            raise GridError(f"{where}: {err}") from None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_only(name: str) -> bool:
    """A hub id that names no local directory: what only the hub or its cache can give."""
    return bool(HUB_ID.fullmatch(name)) and not Path(name).expanduser().is_dir()


def fetch_tokenizer(name: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Put hub id `name`'s tokenizer.json (a few MB; its actor fetches it first anyway) in the hub
    cache, so that `check_same_tokenizer` compares the pair before Ray starts; whether it was
    fetched now. A repository without one, or no answer, leaves the comparison to the pair's load."""
    return _fetch(name, "tokenizer.json", timeout)


def fetch_config(name: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Put hub id `name`'s config.json in the hub cache (for `check_head_here` before Ray starts)."""
    return _fetch(name, "config.json", timeout)


def _fetch(name: str, filename: str, timeout: float) -> bool:
    if not _hub_only(name) or hub_offline() or _cached_file(name, filename) is not None:
        return False
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(name, filename, etag_timeout=timeout)
    except Exception:  # not in the repository, no network: checked at load
        return False
    return True


def check_hub_id_resolves(name: str, where: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """A hub id must resolve before Ray starts: its config in this machine's hub cache, or, with
    the hub on, a metadata request for it answered within `timeout` seconds. A model that cannot
    be downloaded then fails here in seconds, not in the actors after Ray has started. (Not run
    by `--dry-run`, which plans without models.)"""
    if not _hub_only(name) or _cached_file(name, "config.json") is not None:
        return
    if hub_offline():
        raise GridError(f"{where}: {name!r} is not in the local hub cache and HF_HUB_OFFLINE is set")
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=timeout)
    except GatedRepoError:
        raise GridError(f"{where}: {name!r} is gated on the hub: accept its terms there and log in "
                        "(`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise GridError(f"{where}: {name!r} is not on the hub "
                        "(or is private: log in with `hf auth login`)") from None
    except EntryNotFoundError:
        raise GridError(f"{where}: {name!r} has no config.json on the hub: "
                        "not a transformers model") from None
    except Exception as err:  # no network, DNS, a proxy, a timeout: the download would fail the same way
        raise GridError(f"{where}: cannot reach the hub ({constants.ENDPOINT}) to resolve {name!r} "
                        f"within {timeout:g} s ({type(err).__name__}: {err}); with a cached copy set "
                        "HF_HUB_OFFLINE=1, or name a local directory") from None


def check_same_tokenizer(target: str, draft: str, where: str) -> None:
    """Target and draft must share a tokenizer: proposals are token ids. Checked where both
    tokenizers are on this machine, each a local directory's `tokenizer.json` or a hub id's in
    the hub cache, without loading either: when the grid is read, and again before Ray starts
    once `fetch_tokenizer` has fetched what the cache lacked (else the pair is checked when it
    loads)."""
    if reads_target(draft):  # a head or lookup speaks its target's tokenizer, being part of it
        return
    draft = model_of(draft)  # beside a lookup, the draft model
    vocabularies = []
    for name in (target, draft):
        path = Path(name).expanduser() / "tokenizer.json"
        path = path if path.is_file() else _cached_file(name, "tokenizer.json")
        if path is None:
            return
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise GridError(f"{where}: cannot read {path}: {err}") from err
        vocab = (data.get("model") or {}).get("vocab")
        added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [])
        vocabularies.append((vocab, added))
    if vocabularies[0] != vocabularies[1]:
        raise GridError(f"{where}: target {target!r} and draft {draft!r} have different tokenizers; "
                        "speculative decoding needs the draft to share the target's vocabulary")


# the tiny: and embedded: state-space drafts, known as such before they are built or loaded
RECURRENT_NAMES = (f"{TINY_PREFIX}mamba_draft", f"{TINY_PREFIX}mamba2_draft", "embedded:ssm_draft")


# Positions the built-in models hold, known without building or loading them: tiny LLaVAs'
# Llama (pipeline.models.tiny) and SmolLM2-135M under the embedded models (its small draft's config).
KNOWN_CONTEXTS = {**{f"{TINY_PREFIX}{m}": 4096 for m in ("target", "draft", "next_target", "bigram_target")},
                  **{m: 8192 for m in ("embedded:target", "embedded:draft", "embedded:small_draft")}}


def context_length(name: str) -> int | None:
    """The positions (prompt and answer) model `name` holds, where known without a download:
    its config's (local directories, cached hub ids) or a built-in's; None otherwise."""
    config = readable_config(name) or {}
    limit = (config.get("text_config") or config).get("max_position_embeddings")
    return limit if isinstance(limit, int) else KNOWN_CONTEXTS.get(name)


def readable_config(name: str) -> dict | None:
    """A model's config.json when it can be read here without a download: a local directory's,
    or a hub id's from the local hub cache; None otherwise (tiny:, embedded:, not cached)."""
    path = Path(name).expanduser() / "config.json"
    if not path.is_file() and HUB_ID.fullmatch(name):
        path = _cached_file(name, "config.json") or path
    return _json_file(path)


def check_pair_here(pair: Pair, where: str, *, allow_text: bool) -> None:
    """What can be checked of a grid's pair from files on this machine, without loading it: one
    tokenizer, a head drafting for its own target, each model's family."""
    check_same_tokenizer(pair.target, pair.draft, where)
    check_head_here(pair.target, pair.draft, f"{where}.draft")
    for role in ("target", "draft"):
        check_family_here(getattr(pair, role), f"{where}.{role}", allow_text=allow_text)


def check_family_here(name: str, where: str, *, allow_text: bool) -> None:
    """Refuse, by name, a model whose config (where readable here) is of no supported family
    (`pipeline.models.families`), or text-only where the pair does not say `text_only`."""
    if reads_target(name):  # no family's model: `check_head_here` checks a head
        return
    name = model_of(name)
    config, role = readable_config(name), where.rsplit(".", 1)[-1]
    if config is None:
        try:
            drafts_only(name, role, recurrent=name in RECURRENT_NAMES)
        except UnsupportedFamily as err:
            raise GridError(f"{where}: {err}") from None
        return
    try:
        check_family(config, name, allow_text=allow_text)
        check_role(config, name, role)
    except UnsupportedFamily as err:
        raise GridError(f"{where}: {err}") from None
