"""Post-processing of saved responses, offline and repeatable.

- patches: SEARCH/REPLACE edits, unified diffs and str_replace tool calls -> git-style patches
  -> SWE-bench predictions (optionally by majority over normalized patches);
- votes: answer extraction + normalization -> majority per group, maj@k/pass@k/mean@k;
- files: deliverable files from fenced blocks or JSON specs (and optionally a run script).

All read response files through `read_responses` / `iter_groups`.
"""

from __future__ import annotations

from jsonlbatch.post.apply import (
    AppliedEdits,
    EditResult,
    FileSource,
    MappedFiles,
    RepoFiles,
    apply_edits,
)
from jsonlbatch.post.diffs import file_diff, make_diff, normalize_code, normalized_diff
from jsonlbatch.post.edits import Edit, ParsedEdits, extract_edits
from jsonlbatch.post.extract import (
    INVALID,
    extract_answer,
    get_extractor,
    get_normalizer,
    normalize_answer,
)
from jsonlbatch.post.files import FileRecord, FileSpec, Limits, extract_files, find_files
from jsonlbatch.post.patches import (
    PatchSample,
    choose_patch,
    instance_sources,
    make_patches,
    patch_sample,
    run_patches,
)
from jsonlbatch.post.paths import UnsafePathError, safe_relpath
from jsonlbatch.post.responses import (
    Group,
    Sample,
    iter_groups,
    make_key,
    read_responses,
    split_key,
    split_think,
)
from jsonlbatch.post.sandbox import RunLimits, RunResult, run_script
from jsonlbatch.post.summary import UnusableSamplesError, Unused
from jsonlbatch.post.votes import Accuracy, Tally, run_votes, vote, vote_group

__all__ = [
    "INVALID",
    "Accuracy",
    "AppliedEdits",
    "Edit",
    "EditResult",
    "FileRecord",
    "FileSource",
    "FileSpec",
    "Group",
    "Limits",
    "MappedFiles",
    "ParsedEdits",
    "PatchSample",
    "RepoFiles",
    "RunLimits",
    "RunResult",
    "Sample",
    "Tally",
    "UnsafePathError",
    "UnusableSamplesError",
    "Unused",
    "apply_edits",
    "choose_patch",
    "extract_answer",
    "extract_edits",
    "extract_files",
    "file_diff",
    "find_files",
    "get_extractor",
    "get_normalizer",
    "instance_sources",
    "iter_groups",
    "make_diff",
    "make_key",
    "make_patches",
    "normalize_answer",
    "normalize_code",
    "normalized_diff",
    "patch_sample",
    "read_responses",
    "run_patches",
    "run_script",
    "run_votes",
    "safe_relpath",
    "split_key",
    "split_think",
    "vote",
    "vote_group",
]
