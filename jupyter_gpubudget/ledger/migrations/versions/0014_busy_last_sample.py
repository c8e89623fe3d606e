"""the busy fraction of each charge interval's latest sample (``busy_charges.last_busy``: a
session's live GPU utilisation, read from the ledger by whichever replica answers); members'
requests for more GPU-hours for a project and their answers (``budget_requests``)

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('busy_charges') as b:
        b.add_column(sa.Column('last_busy', sa.Float(), nullable=True))
    op.create_table(
        'budget_requests',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('gpu_hours', sa.Float(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('state', sa.String(20), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('decided_at', sa.Float(), nullable=True),
        sa.Column('decided_by', sa.String(200), nullable=True),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('grant_version', sa.Integer(), nullable=True))
    op.create_index('ix_budget_requests_state_project', 'budget_requests',
                    ['state', 'project'])
    op.create_index('ix_budget_requests_user', 'budget_requests', ['user'])


def downgrade() -> None:
    op.drop_index('ix_budget_requests_user', 'budget_requests')
    op.drop_index('ix_budget_requests_state_project', 'budget_requests')
    op.drop_table('budget_requests')
    with op.batch_alter_table('busy_charges') as b:
        b.drop_column('last_busy')
