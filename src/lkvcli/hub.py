"""Push a bundle folder to the Hugging Face Hub (or any server that speaks its API).

The token comes from ``HF_TOKEN`` or the ``hf auth login`` cache, the server from
``HF_ENDPOINT`` (read at call time). The token is handed to ``huggingface_hub`` only: it
is never printed, logged or written anywhere by lkv. A failed push never touches the
local folder, and pushing again is safe (the repository is reused; each push is one commit).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import faults
from .errors import LkvError


def endpoint() -> str:
    """The Hub server: ``$HF_ENDPOINT`` (read now, not at import) or huggingface.co."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def check_repo_id(repo_id: str) -> str:
    """``ORG/NAME`` (or ``NAME``) as the Hub accepts it; anything else is an LkvError."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        why = str(exc).replace(" Use `repo_type` argument if needed.", "")
        raise LkvError(f"invalid repo id {repo_id!r}: {why} Use ORG/NAME, for example me/lookaheadkv-smollm2") from None
    return repo_id


def push_folder(folder: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
                commit_message: str | None = None) -> str:
    """Create ``repo_id`` if needed and upload every file of ``folder`` in one commit; returns the commit URL."""
    from huggingface_hub import HfApi, get_token

    folder = Path(folder)
    check_repo_id(repo_id)
    token = get_token()
    if not token:
        raise LkvError("pushing needs a Hugging Face token with write access: set HF_TOKEN or run `hf auth login` "
                       f"(nothing was sent; the bundle at {folder} is ready)")
    server = endpoint()
    faults.point("push", folder)
    api = HfApi(endpoint=server, token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision and revision != "main" and not revision.startswith("refs/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                                 commit_message=commit_message or f"Upload LookaheadKV bundle {folder.name}")
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line with the way out
        raise LkvError(f"push to {server}/{repo_id} failed: {_explain(exc, repo_id, server)}; the bundle at {folder} "
                       f"is intact: fix this, then run `lkv export {folder} --push-to-hub {repo_id}` again "
                       "(pushing again is safe)") from exc
    return str(getattr(info, "commit_url", info))


def _explain(exc: Exception, repo_id: str, server: str) -> str:
    """One clause per failure kind (the server's own words are kept short; the token is never in them)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code == 401:
            return "the server refused the token (401): check HF_TOKEN or `hf auth login` and that the token is valid"
        if code == 403:
            return f"the token may not write to {repo_id} (403): use a token with write access to that namespace"
        if code == 404:
            return (f"repository {repo_id} or its revision was not found (404): check the repo id, the --revision, "
                    "and that the token can write to that namespace")
        return f"the server answered {code} ({str(exc).splitlines()[0]})"
    if isinstance(exc, httpx2.TransportError) or isinstance(exc, OSError):
        return f"could not reach {server} ({type(exc).__name__}: {exc}); check the network or HF_ENDPOINT"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
