"""`faas-gpu build`: what `faas-cli build --shrinkwrap` does, then an image in the local store.

The build context is laid out exactly as go-sdk's builder.CreateBuildContext lays it out:
`build/<fn>/` is a copy of `template/<lang>/` with the handler overlaid at
`build/<fn>/<handler_folder>/`, the handler's own `build` and `template` entries skipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from faas_gpu import paths
from faas_gpu.imagestore import BuildError, ImageRecord, ImageStore
from faas_gpu.stack import FunctionSpec

SKIP_IN_HANDLER = {"build", "template"}


def find_template(lang: str, stack_dir: Path) -> Path:
    """./template/<lang> beside the stack file first (what `template pull` wrote), then ours."""
    candidates = [stack_dir / "template" / lang, paths.TEMPLATES_DIR / lang]
    for c in candidates:
        if (c / "template.yml").is_file():
            return c
    looked = ", ".join(str(c) for c in candidates)
    raise BuildError(f"lang: template {lang!r} not found (looked in {looked}); try `faas-gpu template pull`")


def template_info(template_dir: Path) -> dict:
    data = yaml.safe_load((template_dir / "template.yml").read_text()) or {}
    if not isinstance(data, dict):
        raise BuildError(f"{template_dir / 'template.yml'}: must be a mapping")
    return data


def shrinkwrap(spec: FunctionSpec, out_dir: Path | None = None) -> Path:
    if spec.skip_build or not spec.lang or not spec.handler:
        raise BuildError(f"functions.{spec.name}: skip_build is set or lang/handler missing; nothing to build")
    template = find_template(spec.lang, spec.stack_dir)
    handler_folder = template_info(template).get("handler_folder") or "function"
    handler = (spec.stack_dir / spec.handler).resolve()
    if not handler.is_dir():
        raise BuildError(f"functions.{spec.name}.handler: folder {spec.handler!r} not found")
    out = (out_dir or spec.stack_dir / "build") / spec.name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(template, out, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    dest = out / handler_folder  # the template's own files stay; the handler's overwrite them
    dest.mkdir(parents=True, exist_ok=True)
    for entry in handler.iterdir():
        if entry.name in SKIP_IN_HANDLER or entry.name == "__pycache__":
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(entry, dest / entry.name)
    return out


def build(spec: FunctionSpec, store: ImageStore | None = None, out_dir: Path | None = None) -> ImageRecord:
    """Shrinkwrap, then install the context as an image the local runtime can run."""
    context = shrinkwrap(spec, out_dir)
    info = template_info(context)
    fprocess = spec.fprocess or info.get("fprocess") or ""
    if not fprocess:
        raise BuildError(f"functions.{spec.name}: the template has no fprocess and none is given")
    return (store or ImageStore()).add(spec.image, context, lang=spec.lang or "", fprocess=fprocess)
