"""jobs that start off-peak: ``workloads.not_before``, the instant before which a job that
asked ``start: off-peak`` is not started (the next off-peak window's start at submission)

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workloads') as b:
        b.add_column(sa.Column('not_before', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workloads') as b:
        b.drop_column('not_before')
