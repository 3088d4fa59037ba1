"""A model's hub name, and which of its repository's files serve it (no network here: sources.hub fetches).

    name = HubName.parse("unsloth/Qwen3-4B-GGUF:q4_k_m")      # HubName(repo, tag="Q4_K_M", revision=None)
    pick = pick_files(name, {"Qwen3-4B-Q4_K_M.gguf": 2.5e9, "Qwen3-4B-Q8_0.gguf": 4.3e9, "README.md": 1e3})
    pick.files, pick.model      # ["Qwen3-4B-Q4_K_M.gguf"], "Qwen3-4B-Q4_K_M.gguf" (what is served: a directory "")

Names as the peers take them: `owner/repo` (a safetensors checkpoint: its config, tokenizer and weights),
`owner/repo:QUANT` (the GGUF of that quantization, llama.cpp's `-hf` tag, case-insensitive; without a tag, a
repository of GGUFs only gives its `Q4_K_M`, or its one quantization), `@revision` (a branch, tag or commit).
"""
import re
from dataclasses import dataclass

from rosefast.errors import ModelError
from rosefast.sources.gguf_file import split_parts, split_position

DEFAULT_QUANT = "Q4_K_M"   # llama.cpp's pick without a tag
_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[\w])(?P<rest>(?:[:@][^:@]+){0,2})$")
#: a quantization in a file's name: Q4_K_M, IQ2_XXS, Q8_0, TQ1_0, BF16, F16, F32, MXFP4_MOE, unsloth's UD-Q4_K_XL
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q|TQ)\d+(?:_[A-Za-z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)"
                    r"(?![A-Za-z0-9])", re.IGNORECASE)
#: the files of a safetensors checkpoint that serving reads (top level only: no onnx/, original/, gguf)
CHECKPOINT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                    "chat_template.jinja", "chat_template.json")


@dataclass(frozen=True)
class HubName:
    repo: str
    tag: str | None = None       # a GGUF quantization, upper case
    revision: str | None = None  # None: the default branch

    @classmethod
    def parse(cls, spec):
        """The hub name `spec` is written as, or None when it is not shaped as one (a path, a bare word)."""
        text = str(spec)
        if text.startswith((".", "/", "~")) or text.endswith(".gguf"):
            return None
        match = _NAME.match(text)
        if match is None:
            return None
        tag = revision = None
        for part in re.findall(r"[:@][^:@]+", match["rest"]):
            if part[0] == ":" and tag is None:
                tag = part[1:].upper()
            elif part[0] == "@" and revision is None:
                revision = part[1:]
            else:
                return None
        return cls(match["repo"], tag, revision)

    def __str__(self):
        return self.repo + (f":{self.tag}" if self.tag else "") + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Pick:
    files: tuple     # the repository's files to fetch
    model: str       # the GGUF (its first part) to serve, or "" for the checkpoint's directory
    kind: str        # "gguf" or "checkpoint"


def quant_of(filename):
    """The quantization a GGUF's name says (upper case), or None."""
    position = split_position(filename)
    stem = position[2] if position else filename.rsplit("/", 1)[-1][:-len(".gguf")]
    found = _QUANT.findall(stem) or _QUANT.findall(filename)
    return found[-1].upper() if found else None


def _ggufs(files):
    """{quantization: [the GGUFs of it]} of a repository's files (the vision projectors, mmproj-*, left out;
    a split file's later parts go with its first)."""
    quants = {}
    for name in sorted(files):
        base = name.rsplit("/", 1)[-1]
        if not name.endswith(".gguf") or base.lower().startswith("mmproj"):
            continue
        position = split_position(name)
        if position is not None and position[0] != 1:
            continue
        quants.setdefault(quant_of(name) or base[:-len(".gguf")], []).append(name)
    return quants


def _parts(first, files):
    """The files of the GGUF whose first (or only) part is `first`; ModelError when a part is not there."""
    names = [str(p) for p in split_parts(first)]
    missing = [n for n in names if n not in files]
    if missing:
        raise ModelError(f"the split GGUF {first} has {len(names)} parts, but {missing[0]} is not in the "
                         "repository")
    return names


def pick_files(name, files):
    """The Pick for hub name `name` from its repository's `files` ({path: size}); ModelError naming what the
    repository has when nothing there serves the name."""
    quants = _ggufs(files)
    checkpoint = "config.json" in files and any(
        "/" not in f and f.endswith((".safetensors", ".bin")) for f in files)
    if name.tag is None and checkpoint:
        return _checkpoint(files)
    if not quants:
        if name.tag is not None:
            raise ModelError(f"{name.repo} has no GGUF files, so no quantization {name.tag!r}: serve it as "
                             f"{name.repo!r} (its safetensors checkpoint)" if checkpoint else
                             f"{name.repo} has no GGUF files, so no quantization {name.tag!r}")
        raise ModelError(f"{name.repo} holds no model rosefast serves: neither a checkpoint (config.json with "
                         "safetensors weights) nor a .gguf file")
    listed = ", ".join(sorted(quants))
    tag = name.tag
    if tag is None:
        if DEFAULT_QUANT in quants:
            tag = DEFAULT_QUANT
        elif len(quants) == 1:
            tag = next(iter(quants))
        else:
            raise ModelError(f"{name.repo} has GGUFs of {listed} and no {DEFAULT_QUANT}: name one, as "
                             f"{name.repo}:{next(iter(sorted(quants)))}")
    matching = quants.get(tag) or [f for q, fs in quants.items() for f in fs if q.upper().endswith(tag)]
    if not matching:
        raise ModelError(f"{name.repo} has no GGUF of quantization {tag!r}: it has {listed}")
    first = min(matching, key=lambda f: (f.count("/"), len(f), f))   # several files of one quantization: the
    return Pick(tuple(_parts(first, files)), first, "gguf")          # top-level, shortest name


def _checkpoint(files):
    top = {f for f in files if "/" not in f}
    weights = sorted(f for f in top if f.endswith(".safetensors")) or sorted(
        f for f in top if f.endswith(".bin") and f.startswith("pytorch_model"))
    index = [f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json") if f in top]
    wanted = [f for f in CHECKPOINT_FILES if f in top] + index + weights
    return Pick(tuple(wanted), "", "checkpoint")
