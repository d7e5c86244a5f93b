"""Training's services (writes, each in one transaction with its audit event), one module per
concern: items, rollouts, datasets, jobs, evaluations, versions; `common` holds what they share.
A dataset's build streams its groups through `dataset_groups` into the files `dataset_writer` writes."""

from .adapters import adapter_load, adapter_server_register
from .common import (
    FINISHED_RUN,
    MAX_ITEMS,
    MAX_K,
    MAX_TEMPERATURE,
    QUEUED_RUNS_LOCK_NAMESPACE,
    ROLLOUT_DEFAULTS,
    TRAINING_KEY_PREFIX,
    TrainingError,
    check_or_refuse,
    queued_runs_guard,
    user_of,
)
from .dataset_groups import conductor_prompt
from .datasets import (
    DATASET_FILES,
    DATASET_LOCK_NAMESPACE,
    DatasetFilter,
    dataset_build,
    dataset_files,
    dataset_preview,
)
from .evaluations import (
    Comparison,
    evaluation_comparison,
    evaluation_estimate,
    evaluation_refresh,
    evaluation_start,
    evaluation_summary,
)
from .items import item_task, offline_runs, replay_item_ids, replay_items
from .jobs import (
    LEARNED_DEFAULTS,
    LEARNED_LIMITS,
    LORA_DEFAULTS,
    LORA_LIMITS,
    job_cancel,
    job_options,
    job_start,
)
from .rollouts import rollout_batch_counts, rollout_batch_refresh, rollouts_estimate, rollouts_start
from .versions import (
    OVERRIDE_REASON_MAX_CHARS,
    PromotionRefused,
    conductor_promote,
    conductor_rollback,
    promotion_gate,
    rollback_target,
    shadow_set,
)

__all__ = [
    "adapter_load",
    "adapter_server_register",
    "DATASET_FILES",
    "DATASET_LOCK_NAMESPACE",
    "DatasetFilter",
    "FINISHED_RUN",
    "LEARNED_DEFAULTS",
    "LEARNED_LIMITS",
    "LORA_DEFAULTS",
    "LORA_LIMITS",
    "MAX_ITEMS",
    "MAX_K",
    "MAX_TEMPERATURE",
    "ROLLOUT_DEFAULTS",
    "QUEUED_RUNS_LOCK_NAMESPACE",
    "TRAINING_KEY_PREFIX",
    "TrainingError",
    "check_or_refuse",
    "conductor_promote",
    "PromotionRefused",
    "OVERRIDE_REASON_MAX_CHARS",
    "promotion_gate",
    "conductor_prompt",
    "conductor_rollback",
    "dataset_build",
    "dataset_files",
    "dataset_preview",
    "evaluation_estimate",
    "evaluation_comparison",
    "Comparison",
    "evaluation_refresh",
    "evaluation_start",
    "evaluation_summary",
    "item_task",
    "job_cancel",
    "job_options",
    "job_start",
    "offline_runs",
    "queued_runs_guard",
    "replay_item_ids",
    "replay_items",
    "rollout_batch_counts",
    "rollout_batch_refresh",
    "rollouts_estimate",
    "rollouts_start",
    "rollback_target",
    "shadow_set",
    "user_of",
]
