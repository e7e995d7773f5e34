"""`faas-gpu build`: what `faas-cli build --shrinkwrap` does, then an image in the local store.

The build context is laid out as go-sdk's builder.CreateBuildContext lays it out:
`build/<fn>/` is a copy of `template/<lang>/`, with the handler folder's entries overlaid at
`build/<fn>/<handler_folder>/` (the template's own files there stay unless the handler has a
file of the same name), the handler's own `build` and `template` entries skipped, then the
stack's `configuration.copy` paths copied into `build/<fn>/<handler_folder>/<path>`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from faas_gpu import paths
from faas_gpu.imagestore import BuildError, ImageRecord, ImageStore, StepCallback, build_inputs
from faas_gpu.stack import FunctionSpec, StackError, resolve_inside

SKIP_IN_HANDLER = ("build", "template")
_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache")


@dataclass(frozen=True)
class LanguageTemplate:
    """template/<lang>/template.yml (go-sdk LanguageTemplate)."""

    path: Path
    language: str
    fprocess: str
    welcome_message: str
    handler_folder: str
    build_options: list


def template_dirs(stack_dir: Path | None = None) -> list[Path]:
    """Where templates are looked up: ./template beside the stack file, then the repo's templates/."""
    stack_dir = Path(stack_dir) if stack_dir is not None else Path.cwd()
    return [stack_dir / "template", paths.TEMPLATES_DIR]


def find_template(lang: str, stack_dir: Path | None = None, *, function: str | None = None) -> Path:
    candidates = [d / lang for d in template_dirs(stack_dir)]
    for c in candidates:
        if (c / "template.yml").is_file():
            return c
    looked = ", ".join(str(c) for c in candidates)
    who = f"functions.{function}.lang: " if function else "lang: "
    raise BuildError(
        f"{who}template {lang!r} not found (looked in {looked}); run `faas-gpu template pull` or check the lang"
    )


def template_info(template_dir: Path) -> dict:
    """template.yml as a dict (kept for callers that want the raw fields)."""
    path = Path(template_dir) / "template.yml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BuildError(f"{path}: cannot read the template: {exc}") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: must be a mapping")
    return data


def load_template(template_dir: Path) -> LanguageTemplate:
    data = template_info(template_dir)
    return LanguageTemplate(
        path=Path(template_dir),
        language=str(data.get("language") or Path(template_dir).name),
        fprocess=str(data.get("fprocess") or ""),
        welcome_message=str(data.get("welcome_message") or ""),
        handler_folder=str(data.get("handler_folder") or "function"),
        build_options=list(data.get("build_options") or []),
    )


def _copy(src: Path, dest: Path) -> None:
    """go-sdk CopyFiles: a folder is merged into dest (files overwritten), a file replaces dest."""
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=False, ignore=_IGNORE, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def _inside(stack_dir: Path, value: str, where: str) -> Path:
    try:
        return resolve_inside(stack_dir, value, where)
    except StackError as exc:
        raise BuildError(str(exc)) from None


def _refuse_links_outside(src: Path, stack_dir: Path, where: str) -> None:
    """A link in the handler folder to /etc would be copied as /etc: refuse any that leaves the project."""
    if not src.is_dir():
        return
    root = stack_dir.resolve()
    for folder, dirs, files in os.walk(src):
        for name in dirs + files:
            entry = Path(folder) / name
            if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                raise BuildError(
                    f"{where}: {entry.relative_to(src)} links outside the stack file's folder ({root}); "
                    "copy what it needs into the project"
                )


def shrinkwrap(spec: FunctionSpec, stack_dir: Path | str | None = None, out_dir: Path | str = "build") -> Path:
    """Write `<out_dir>/<fn>/` exactly as `faas-cli build --shrinkwrap` does; returns that folder.

    `stack_dir` (default: the folder of the stack file the spec came from) is where the handler,
    `./template/` and relative `out_dir` are resolved.
    """
    stack_dir = Path(stack_dir) if stack_dir is not None else Path(spec.stack_dir)
    if spec.skip_build:
        raise BuildError(f"functions.{spec.name}: skip_build is set; nothing to build")
    if not spec.lang:
        raise BuildError(f"functions.{spec.name}.lang: is required to build")
    if not spec.handler:
        raise BuildError(f"functions.{spec.name}.handler: is required to build")
    handler = _inside(stack_dir, spec.handler, f"functions.{spec.name}.handler")
    if not handler.is_dir():
        raise BuildError(f"functions.{spec.name}.handler: folder {spec.handler!r} not found in {stack_dir}")
    _refuse_links_outside(handler, stack_dir, f"functions.{spec.name}.handler")
    for extra in spec.copy:  # checked before anything is written
        _refuse_links_outside(_inside(stack_dir, extra, "configuration.copy"), stack_dir, "configuration.copy")
    out_root = Path(out_dir) if Path(out_dir).is_absolute() else stack_dir / out_dir
    out = out_root / spec.name
    if out.exists() or out.is_symlink():
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        else:
            out.unlink()

    if spec.lang == "dockerfile":
        # faas-cli: the handler folder is the whole build context; no template is used
        handler_folder_path = out
        out.mkdir(parents=True)
    else:
        template = load_template(find_template(spec.lang, stack_dir, function=spec.name))
        handler_folder_path = out / template.handler_folder
        handler_folder_path.mkdir(parents=True)
        _copy(template.path, out)
    for entry in sorted(handler.iterdir()):
        if entry.name in SKIP_IN_HANDLER or entry.name in ("__pycache__", ".pytest_cache"):
            continue
        _copy(entry, handler_folder_path / entry.name)
    for extra in spec.copy:
        src = _inside(stack_dir, extra, "configuration.copy")
        if not src.exists():
            raise BuildError(f"configuration.copy: {extra!r} not found in {stack_dir}")
        _copy(src, handler_folder_path / extra)
    return out


def build(
    spec: FunctionSpec,
    store: ImageStore | None = None,
    out_dir: Path | str = "build",
    *,
    stack_dir: Path | str | None = None,
    quiet: bool = True,
    on_step: StepCallback | None = None,
    reuse: bool = False,
) -> ImageRecord:
    """Shrinkwrap, then add the context to the local image store as `spec.image`; `on_step` hears
    of each step (the shrink-wrap, then the store's), for a progress bar. `reuse`: when the store's
    current `spec.image` was built from the same inputs (the context's files, lang, fprocess, the
    interpreter: `imagestore.build_inputs`), it is returned as it is, with no environment made and
    no pip run, as Docker's layer cache skips an unchanged build."""
    if spec.lang == "dockerfile" and not spec.fprocess:
        raise BuildError(
            f"functions.{spec.name}: dockerfile functions cannot be built into the local image store "
            "without an fprocess; build them with docker and deploy with skip_build: true"
        )
    if on_step is not None:
        on_step("shrink-wrap", 1)
    context = shrinkwrap(spec, stack_dir, out_dir)
    fprocess = spec.fprocess
    if not fprocess and (context / "template.yml").is_file():
        fprocess = load_template(context).fprocess
    if not fprocess:
        raise BuildError(f"functions.{spec.name}: the template has no fprocess and the function gives none")
    store = store or ImageStore()
    inputs = build_inputs(context, lang=spec.lang or "", fprocess=fprocess)
    if reuse and (current := store.up_to_date(spec.image, inputs)) is not None:
        return current
    try:
        return store.add(
            spec.image,
            context,
            lang=spec.lang or "",
            fprocess=fprocess,
            quiet=quiet,
            on_step=None if on_step is None else lambda label, total: on_step(label, total + 1),
            inputs=inputs,
        )
    except BuildError as exc:
        raise BuildError(f"functions.{spec.name}: {exc}") from None


def docker_build(
    spec: FunctionSpec,
    *,
    stack_dir: Path | str | None = None,
    out_dir: Path | str = "build",
    build_args: dict[str, str] | None = None,
    docker_host: str | None = None,
    push: bool = False,
    log=print,
) -> str:
    """Shrink-wrap, then `docker build` the context and tag it `spec.image`, as `faas-cli build`
    does (`--build-arg ADDITIONAL_PACKAGE=`, the stack's `build_args`, then the command line's);
    `push`: `docker push` it to the registry its name says. Returns the image id.

    Why the Docker Engine and not the image store: the docker runtime runs images, and an image
    built here is the same one `faas-cli build` builds (the template's Dockerfile)."""
    import docker  # only where an engine is used
    from docker.errors import APIError, DockerException
    from docker.errors import BuildError as DockerBuildError

    from faas_gpu.contract import env as env_vars

    context = shrinkwrap(spec, stack_dir, out_dir)
    args = {"ADDITIONAL_PACKAGE": "", **(spec.build_args or {}), **(build_args or {})}
    host = docker_host or env_vars.DOCKER_HOST.read()
    try:
        client = docker.DockerClient(base_url=host, version="auto") if host else docker.from_env(version="auto")
        image, _ = client.images.build(path=str(context), tag=spec.image, buildargs=args, rm=True, forcerm=True)
    except DockerBuildError as exc:
        tail = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in list(exc.build_log)[-20:])
        raise BuildError(f"functions.{spec.name}: docker build failed: {exc.msg}\n{tail}") from None
    except DockerException as exc:
        raise BuildError(f"functions.{spec.name}: docker build failed: {exc}") from None
    if push:
        repository, tag = spec.image, "latest"
        if ":" in spec.image.rsplit("/", 1)[-1]:  # a tag, not a registry's port
            repository, _, tag = spec.image.rpartition(":")
        try:
            for line in client.images.push(repository, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise BuildError(f"functions.{spec.name}: docker push {spec.image} failed: {line['error']}")
        except (APIError, DockerException) as exc:
            raise BuildError(f"functions.{spec.name}: docker push {spec.image} failed: {exc}") from None
        log(f"Pushed: {spec.image}")
    return str(image.id)
