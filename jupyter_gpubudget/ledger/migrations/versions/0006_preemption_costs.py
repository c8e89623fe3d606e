"""a job's declared checkpoint interval, and a backfilled start's deadline

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.add_column(sa.Column('checkpoint_interval', sa.Float(), nullable=True))
        batch.add_column(sa.Column('backfill_until', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.drop_column('backfill_until')
        batch.drop_column('checkpoint_interval')
