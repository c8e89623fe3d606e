"""decisions by kind and time: every cycle reads the last day's preemptions and what each
threw away (``Ledger.recent_losses``, ``Policy.finish_drain_budget``) without scanning the
day's other decisions

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_decisions_kind_at', 'decisions', ['kind', 'at'])


def downgrade() -> None:
    op.drop_index('ix_decisions_kind_at', table_name='decisions')
