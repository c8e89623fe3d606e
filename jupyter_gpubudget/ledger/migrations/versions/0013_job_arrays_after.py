"""job arrays and dependencies: each task of an array is a workload with its array's id, its
index and the array's max_running; a job that runs after others lists them and how
(afterok, afterany, afternotok)

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.add_column(sa.Column('array_id', sa.String(64), nullable=True))
        batch.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('array_max', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('after', sa.Text(), nullable=True))
        batch.add_column(sa.Column('after_kind', sa.String(20), nullable=True))
        batch.create_index('ix_workloads_array_id', ['array_id'])


def downgrade() -> None:
    with op.batch_alter_table('workloads') as batch:
        batch.drop_index('ix_workloads_array_id')
        batch.drop_column('after_kind')
        batch.drop_column('after')
        batch.drop_column('array_max')
        batch.drop_column('array_index')
        batch.drop_column('array_id')
