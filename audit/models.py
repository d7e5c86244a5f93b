"""The audit record: append-only, hash-chained events, signed checkpoints, policies and legal holds.

Events form chains: one per run (`run:<correlation id>`, its steps contend only with each other) and a
global chain for human actions, pool and policy changes, and the seals of finished runs. Each event
carries sha256(previous hash + canonical content); PostgreSQL triggers reject UPDATE, DELETE and
TRUNCATE (see the migrations), so a change made behind the app's back shows up in verification.
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT

from .actions import Action

GLOBAL_CHAIN = "global"

# What the policy report lists: blocks (plans and steps stopped by a rule) and changes to the rules.
# One expression for the report's query and the partial index that serves it (the planner uses the
# index only when the query states exactly its condition).
POLICY_EVENT = (
    Q(action=Action.PLAN_BLOCKED)
    | Q(action__startswith="policyrule.")
    | Q(action=Action.STEP_FAILED, payload__note__startswith="policy")
    | Q(action=Action.RUN_FAILED, payload__stop_reason="policy_blocked")
)


class AuditEvent(models.Model):
    class ActorType(models.TextChoices):
        USER = "user", "User"
        SERVICE = "service", "Service"

    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    occurred_at = models.DateTimeField(db_index=True)
    actor_type = models.CharField(max_length=10, choices=ActorType.choices)
    actor_id = models.CharField(max_length=100, blank=True)
    actor_name = models.CharField(max_length=150, help_text="Copied so the record outlives the account")
    # Indexed by audit_action_prefix (action, newest first, a prefix too): no index of its own, two
    # fewer on every event.
    action = models.CharField(max_length=60)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=100)
    task_id = models.UUIDField(null=True, blank=True, db_index=True)
    # Not indexed: a run's events are its chain's ("run:<correlation id>"), which (chain, seq) serves.
    correlation_id = models.UUIDField(null=True, blank=True)
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq")]
        indexes = [
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            models.Index(fields=["actor_name", "-id"], name="audit_actor"),
            # An action's events newest first; with the pattern operator class its prefix too (the event
            # log's filter, "step." for every step event), under any collation.
            models.Index(
                fields=["action", "-id"],
                name="audit_action_prefix",
                opclasses=["varchar_pattern_ops", "int8_ops"],
            ),
            # A run's seal, found by its chain name: one run's proof is read without scanning seals.
            models.Index(
                KT("payload__chain"), condition=Q(action=Action.RUN_SEALED), name="audit_seal_chain"
            ),
            # The policy report, newest first, without walking every event back to the rare ones.
            models.Index(F("id").desc(), condition=POLICY_EVENT, name="audit_policy_events"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} {self.object_type}:{self.object_id}"


class ChainHead(models.Model):
    """The last event of each chain: locked to append, so only events of one chain wait for each other.

    Derived state, never trusted by verification (which recomputes from the events)."""

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64)
    sealed = models.BooleanField(default=False)
    # Not indexed: every append updates it, and an indexed column would make each update write every
    # index of the table anew (no HOT update). Checkpoints find moved heads by their events' time.
    updated_at = models.DateTimeField(help_text="Moved: the next checkpoint signs it")

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class PendingSeal(models.Model):
    """A run chain sealed by its run's end, waiting for its `run.sealed` event in the global chain.

    A run's end inserts this row (a plain insert, which no other run end waits for) instead of
    appending to the global chain's head itself; the sealer (audit.seals.seal_pending) appends the
    seals in id order, a batch under one lock of the head, and sets `seal_event_id`. A trigger lets a
    row change only that way, once, and never be deleted (a retention purge keeps it: it holds no
    content of the task, only what the seal in the global chain holds too)."""

    chain = models.CharField(max_length=64, unique=True)
    # The run, as events name objects (its model's name, its pk as text).
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=100)
    task_id = models.UUIDField(null=True, blank=True)
    # The run chain's last event, which its end's append sealed.
    seq = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    # The global chain's run.sealed event once appended: an id, not a foreign key (no constraint
    # checked on every mark; verification checks it names this chain's seal).
    seal_event_id = models.BigIntegerField(null=True, blank=True)
    # Its leaf in the log's Merkle tree (audit.log), set by the sealer with seal_event_id: the leaf is
    # proof.seal_leaf of this row's chain, seq, hash and run.
    leaf_index = models.BigIntegerField(null=True, blank=True, unique=True)

    class Meta:
        indexes = [
            # The rows without a leaf, oldest first: what the sealer takes. Partial, so it holds only the few
            # rows waiting; the unique chain index and the primary key are the table's only others.
            models.Index(fields=["id"], condition=Q(leaf_index__isnull=True), name="audit_seal_unlogged"),
        ]

    def __str__(self) -> str:
        state = f"sealed by #{self.seal_event_id}" if self.seal_event_id else "pending"
        return f"seal of {self.chain}@{self.seq} ({state})"


class LogNode(models.Model):
    """A complete node of the log's Merkle tree (audit.merkle): level 0 holds the leaf hashes, level L
    node i the hash of leaves [i * 2**L, (i + 1) * 2**L). Written once, by the sealer, never changed
    (a trigger refuses): any root, audit path or consistency proof is O(log n) of these rows."""

    pk = models.CompositePrimaryKey("level", "index")
    level = models.SmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField(max_length=32)

    def __str__(self) -> str:
        return f"log node {self.level}/{self.index}"


class Checkpoint(models.Model):
    """A signed tree head: the log's size and root and the global chain's head, signed as a C2SP
    checkpoint note (audit.note), numbered and linked to the previous one; written out of the database
    as a file, which is what verification trusts. (Checkpoints of format 2, before the log, signed the
    heads of the chains that moved instead; they still verify.)"""

    number = models.PositiveBigIntegerField(null=True, unique=True, help_text="1, 2, 3...: gaps show")
    created_at = models.DateTimeField()
    body = models.JSONField(
        help_text="What was signed: the heads of the global chain and the open run chains"
    )
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=64)
    file_name = models.CharField(max_length=200)
    # The signed note, as its file holds it (empty for checkpoints of format 2).
    note = models.TextField(blank=True, db_default="")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Checkpoint {self.pk} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class CheckpointHead(models.Model):
    """One chain head a checkpoint signed: finds the checkpoint that covers a run without reading
    every checkpoint. An index only: the signed body is what proves it."""

    # No constraint, DO_NOTHING: deleting a checkpoint is refused by the append-only trigger alone.
    checkpoint = models.ForeignKey(
        Checkpoint, related_name="head_rows", on_delete=models.DO_NOTHING, db_constraint=False
    )
    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=64)

    class Meta:
        indexes = [models.Index(fields=["chain", "-seq"], name="audit_cphead_chain_seq")]

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq} in checkpoint {self.checkpoint_id}"


class ChainPurge(models.Model):
    """A run chain whose events were deleted under the retention policy. Written in the same
    transaction as the deletion (the trigger allows deleting only such chains' events)."""

    chain = models.CharField(max_length=64, unique=True)
    last_seq = models.PositiveBigIntegerField()
    last_hash = models.CharField(max_length=64)
    purged_at = models.DateTimeField()
    reason = models.CharField(max_length=200)
    signature = models.CharField(
        max_length=200,
        blank=True,
        db_default="",
        help_text="Ed25519 by the checkpoint key: the database cannot forge it",
    )
    key_id = models.CharField(max_length=64, blank=True, db_default="")

    def __str__(self) -> str:
        return f"purged {self.chain}"


class PolicyRule(models.Model):
    class Kind(models.TextChoices):
        SELF_HOSTED_ONLY = "self_hosted_only", "Data of these classes goes to self-hosted workers only"
        VENDOR_BLOCKED = "vendor_blocked", "These vendors receive no data (of these classes, or of any)"
        REGION_ALLOWED = "region_allowed", "Data of these classes goes only to workers in these regions"

    name = models.SlugField(max_length=80, unique=True)
    kind = models.CharField(max_length=30, choices=Kind.choices)
    data_classes = ArrayField(
        models.CharField(max_length=20), default=list, blank=True, help_text="Empty: all"
    )
    vendors = ArrayField(models.CharField(max_length=80), default=list, blank=True)
    regions = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Stored as compared (lower-case, stripped), however the rule was made.
        from .policies import normalise_all  # cycle: policies imports this module

        self.vendors = normalise_all(self.vendors or [])
        self.regions = normalise_all(self.regions or [])
        self.data_classes = normalise_all(self.data_classes or [])
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # Vendors and regions must be those of registered workers, data classes known ones: a rule
        # naming anything else would match nothing (audit.policies.rule_values_check says which).
        from .policies import rule_values_check  # policies imports this module

        values = rule_values_check(
            kind=self.kind,
            vendors=self.vendors or [],
            regions=self.regions or [],
            data_classes=self.data_classes or [],
        )
        self.vendors, self.regions, self.data_classes = (
            values["vendors"],
            values["regions"],
            values["data_classes"],
        )


class LegalHold(models.Model):
    """Stops retention from deleting a task's data and record until released."""

    # The task's id, not a foreign key: audit knows nothing of routing. Deleting a held task is refused
    # by routing (governance.holds).
    task_id = models.UUIDField(db_index=True)
    reason = models.TextField()
    placed_by = models.CharField(max_length=150)
    placed_at = models.DateTimeField(auto_now_add=True)
    released_by = models.CharField(max_length=150, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"hold on {self.task_id}"
