from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_create


class Command(BaseCommand):
    help = (
        "Sign the log's tree head and the global chain's head now, and write the checkpoint note "
        "(AUDIT_CHECKPOINT_DIR)."
    )

    def handle(self, *args, **options):
        checkpoint = checkpoint_create()
        self.stdout.write(
            f"checkpoint {checkpoint.number}: the log's {checkpoint.body['tree']['size']} leaves and the "
            f"global chain at seq {checkpoint.body['heads']['global'][0]} signed with key "
            f"{checkpoint.key_id}; file {checkpoint.file_name}"
        )
