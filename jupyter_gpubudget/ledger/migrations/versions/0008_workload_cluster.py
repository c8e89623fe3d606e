"""the named cluster of each workload: the one it asked for while it waits, the one it
started on once it runs (docs/service.md, "Several clusters")

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.add_column(sa.Column('cluster', sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.drop_column('cluster')
