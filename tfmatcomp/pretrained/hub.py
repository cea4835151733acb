"""Downloads from the Hugging Face Hub, the last of the three sources of a pretrained run.

Every file comes through ``huggingface_hub.hf_hub_download`` (the run's repository and revision
from the registry, its progress bar, its resumed transfers), into the download cache's run folder.
The settings every Hub-based library honours are read here, when a download is asked for:

- ``HF_ENDPOINT``: the Hub's address (a mirror, or the tests' stand-in on 127.0.0.1);
- ``HF_HUB_OFFLINE=1``: no request at all;
- ``HF_HOME``: where the download cache lives unless ``TFMATCOMP_CACHE`` says otherwise;
- ``HF_HUB_ETAG_TIMEOUT``: how long the first request may wait for an answer (default 10 s).

A Hub that never answers costs one request of ``HF_HUB_ETAG_TIMEOUT`` seconds: the first file is
probed once without retries before ``hf_hub_download`` (which, when nothing is cached, would retry
for minutes) is called.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError,
)

from tfmatcomp.pretrained.registry import FileEntry, RunEntry

__all__ = ["HubSettings", "PretrainedUnavailable", "hub_settings", "download"]

_TRUE = {"1", "ON", "YES", "TRUE"}


class PretrainedUnavailable(OSError):
    """A pretrained run's files are on no local source and the Hub cannot give them."""


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is, whether it may be asked, and how long its first answer may take."""

    endpoint: str
    offline: bool
    etag_timeout: float


def hub_settings() -> HubSettings:
    """The Hub settings from the environment now (``HF_ENDPOINT``, ``HF_HUB_OFFLINE``,
    ``HF_HUB_ETAG_TIMEOUT``), falling back on what huggingface_hub read at its import."""
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    offline = (os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE
               or constants.is_offline_mode())
    try:
        timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or constants.HF_HUB_ETAG_TIMEOUT)
    except ValueError:
        raise ValueError(f"HF_HUB_ETAG_TIMEOUT: must be a number of seconds, got "
                         f"{os.environ['HF_HUB_ETAG_TIMEOUT']!r}") from None
    return HubSettings(endpoint, offline, timeout)


def _where(run: RunEntry, settings: HubSettings) -> str:
    return f"{run.repo_id}@{run.revision} on {settings.endpoint}"


def _probe(run: RunEntry, file: FileEntry, settings: HubSettings) -> None:
    """One request, no retries: a Hub that does not answer, or lacks the repository, is named
    now rather than after huggingface_hub's retries."""
    url = hf_hub_url(run.repo_id, file.path, revision=run.revision, endpoint=settings.endpoint)
    try:
        get_hf_file_metadata(url, timeout=settings.etag_timeout, endpoint=settings.endpoint,
                             retry_on_errors=False)
    except (httpx2.TimeoutException, httpx2.ConnectError) as e:
        raise PretrainedUnavailable(
            f"pretrained run {run.name!r}: the Hub did not answer ({_where(run, settings)}, "
            f"{type(e).__name__} after at most {settings.etag_timeout:g} s, HF_HUB_ETAG_TIMEOUT)"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise PretrainedUnavailable(
            f"pretrained run {run.name!r}: {_where(run, settings)} does not exist "
            f"({type(e).__name__}; the runs are published at release)") from None
    except EntryNotFoundError:
        pass  # named by the download below, with the file
    except HfHubHTTPError as e:
        raise PretrainedUnavailable(f"pretrained run {run.name!r}: {_where(run, settings)} "
                                    f"answered {' '.join(str(e).split())}") from None


def download(run: RunEntry, files: list[FileEntry], local_dir: Path,
             settings: HubSettings) -> None:
    """Download ``files`` of ``run`` into ``local_dir`` (the cache's run folder). The caller
    verifies them; this only fetches."""
    if not files:
        return
    if settings.offline:
        raise PretrainedUnavailable(f"pretrained run {run.name!r}: the Hub is off "
                                    "(HF_HUB_OFFLINE=1)")
    _probe(run, files[0], settings)
    for f in files:
        try:
            hf_hub_download(run.repo_id, f.path, revision=run.revision, local_dir=local_dir,
                            endpoint=settings.endpoint, etag_timeout=settings.etag_timeout)
        except EntryNotFoundError:
            raise PretrainedUnavailable(f"pretrained run {run.name!r}: {_where(run, settings)} "
                                        f"has no file {f.path!r}") from None
        except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
            raise PretrainedUnavailable(
                f"pretrained run {run.name!r}: downloading {f.path} from {_where(run, settings)} "
                f"failed ({type(e).__name__}: {' '.join(str(e).split())})") from None
