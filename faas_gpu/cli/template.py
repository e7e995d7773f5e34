"""`faas-gpu template pull`: write ./template/<lang>/ and its meta.json, as `faas-cli template pull`."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from faas_gpu import paths

from .common import CliError


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _git(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"template pull: git failed: {exc}") from None


def _repo_sha(repo: Path) -> str:
    proc = _git("-C", str(repo), "rev-parse", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def template_pull(dest_root: Path, source: str | None = None, overwrite: bool = True) -> list[str]:
    """Write ./template/<lang>/ and meta.json (repository, sha, written_at), as `faas-cli template pull`.

    No source (or `python3-gpu`): this repository's templates/. Otherwise a git repository (a
    local path or URL, `#ref` for a branch or tag) whose `template/` folder is copied. Existing
    templates are kept unless `overwrite` (faas-cli's --overwrite); returns the languages written.
    """
    tmp = None
    try:
        if not source or source == "python3-gpu":
            src_root, repository, sha = paths.TEMPLATES_DIR, str(paths.REPO_ROOT), _repo_sha(paths.REPO_ROOT)
        else:
            repository, _, ref = source.partition("#")
            local = Path(repository).expanduser()
            if local.is_dir() and not (local / ".git").exists() and (local / "template").is_dir():
                src_root, sha = local / "template", ""
            else:
                tmp = Path(tempfile.mkdtemp(prefix="faas-gpu-template-"))
                cmd = [
                    "clone",
                    "--depth",
                    "1",
                    "-q",
                    *(["--branch", ref] if ref else []),
                    repository,
                    str(tmp / "repo"),
                ]
                proc = _git(*cmd)
                if proc.returncode != 0:
                    raise CliError(f"template pull: cannot clone {source}: {proc.stderr.strip().splitlines()[-1:]}")
                src_root, sha = tmp / "repo" / "template", _repo_sha(tmp / "repo")
        if not src_root.is_dir():
            raise CliError(f"template pull: {source} has no template/ folder")
        written, kept = [], []
        for tdir in sorted(p for p in src_root.iterdir() if (p / "template.yml").is_file()):
            dest = dest_root / "template" / tdir.name
            if dest.exists() and not overwrite:
                kept.append(tdir.name)
                continue
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(tdir, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
            meta = {"repository": repository, "sha": sha, "written_at": _now_rfc3339()}
            (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            written.append(tdir.name)
        if kept:
            print(f"Cannot overwrite the following {len(kept)} template(s): {kept} (use --overwrite)")
        return written
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def cmd_template(args: argparse.Namespace) -> int:
    written = template_pull(Path.cwd(), args.repository, overwrite=args.overwrite)
    print(f"Wrote {len(written)} template(s) to ./template: {', '.join(written) or '-'}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("template", help="templates")
    tsub = p.add_subparsers(dest="template_command", required=True, metavar="pull")
    tp = tsub.add_parser("pull", help="write ./template/<lang>/ (faas-cli's layout)")
    tp.add_argument("repository", nargs="?", help="python3-gpu (default), or a git repository with template/")
    tp.add_argument("--overwrite", action="store_true", help="replace templates already in ./template")
    tp.set_defaults(func=cmd_template)
