"""A/B the working tree against an older revision of the packages, in one process tree on one device:
the refactor check ("same outputs, same speed") for changes that should not change behaviour.

The older revision is installed beside the editable working tree, non-editable, into a folder of its
own (`pip install --target SITE`); `run` executes a script with the editable installs hidden, so
every `deepinfer_*` import resolves to SITE. `greedy` writes the default model's greedy outputs
(DSpark at nextn 5), `compare` says whether two such files are equal.

    python diag/revision_ab.py greedy after.json                                  # the working tree
    python diag/revision_ab.py run --site /tmp/rev-site -- diag/revision_ab.py greedy before.json
    python diag/revision_ab.py compare after.json before.json
    python diag/revision_ab.py run --site /tmp/rev-site -- /tmp/rev/tools/benchmark.py --model preset:mini ...

tools/gpu_engine_check.sh revision drives it on the device (greedy outputs, then the default model's
nextn-5 decode and `mini` decode at batch 1 / 64, the two trees alternating).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


# drops pip's editable finders (__editable__ hooks, scikit-build-core's redirect) and the working
# tree's source folders; run in this process and, as sitecustomize, in every child it starts
_HIDE_WORKING_TREE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if "editable" not in (getattr(f, "__module__", "") + type(f).__name__ + repr(f)).lower()]
sys.path[:] = [p for p in sys.path if "/packages/deepinfer-" not in p]
"""


def hide_editable_installs(site: str) -> None:
    """Make `deepinfer_*` imports resolve to `site`, here and in child processes (a spawn pool, a
    server): hide the working tree's installs, forget modules already imported."""
    exec(_HIDE_WORKING_TREE)
    sys.path.insert(0, site)
    for name in [m for m in sys.modules if m.startswith("deepinfer_")]:
        del sys.modules[name]
    shim = tempfile.mkdtemp(prefix="revision-ab-")
    Path(shim, "sitecustomize.py").write_text(_HIDE_WORKING_TREE)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([shim, site] + rest)


def greedy_outputs(device: str, num_prompts: int, max_tokens: int, nextn: int) -> list[list[int]]:
    """The default model's greedy token ids over held-out code prompts (256 ids each)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench.engine import code_prompts

    from deepinfer_engine import LLM, SamplingParams

    llm = LLM(None, device=device, max_model_len=1536, num_speculative_tokens=nextn)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=code_prompts(num_prompts, 256), sampling_params=params, use_tqdm=False)
    return [list(o.token_ids) for o in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("greedy", help="write the default model's greedy outputs (JSON: [prompt][token])")
    g.add_argument("out")
    g.add_argument("--device", default="cuda")
    g.add_argument("--num-prompts", type=int, default=32)
    g.add_argument("--max-tokens", type=int, default=48)
    g.add_argument("--nextn", type=int, default=5)
    c = sub.add_parser("compare", help="exit 0 when two greedy files hold the same tokens")
    c.add_argument("a")
    c.add_argument("b")
    r = sub.add_parser("run", help="run a script with `deepinfer_*` imported from --site")
    r.add_argument("--site", required=True)
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)

    if args.cmd == "greedy":
        import deepinfer_engine

        ids = greedy_outputs(args.device, args.num_prompts, args.max_tokens, args.nextn)
        Path(args.out).write_text(json.dumps(ids))
        print(f"{len(ids)} prompts, {sum(map(len, ids))} tokens, deepinfer_engine from {Path(deepinfer_engine.__file__).parent}")
        return 0
    if args.cmd == "compare":
        a, b = json.loads(Path(args.a).read_text()), json.loads(Path(args.b).read_text())
        differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        same = len(a) == len(b) and not differ
        print(f"greedy outputs {'identical' if same else 'DIFFER'}: {len(a)} vs {len(b)} prompts, "
              f"{sum(map(len, a))} tokens, differing prompts {differ[:8]}")
        return 0 if same else 1
    hide_editable_installs(args.site)
    script = str(Path(args.script).resolve())
    sys.argv = [script] + [a for a in args.args if a != "--"]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
