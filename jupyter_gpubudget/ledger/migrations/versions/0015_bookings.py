"""advance reservations (bookings): whole GPUs booked for a project over a window, each
booked GPU named when it is booked; a cancelled booking keeps its row (cancelled_at)

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'bookings',
        sa.Column('id', sa.String(64), primary_key=True),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('cluster', sa.String(100), nullable=True),
        sa.Column('gpu_count', sa.Integer(), nullable=False),
        sa.Column('gpus', sa.JSON(), nullable=False),
        sa.Column('start_at', sa.Float(), nullable=False),
        sa.Column('end_at', sa.Float(), nullable=False),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('created_by', sa.String(200), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('cancelled_at', sa.Float(), nullable=True),
        sa.Column('cancelled_by', sa.String(200), nullable=True))
    op.create_index('ix_bookings_project', 'bookings', ['project'])
    op.create_index('ix_bookings_end_at', 'bookings', ['end_at'])


def downgrade() -> None:
    op.drop_index('ix_bookings_end_at', 'bookings')
    op.drop_index('ix_bookings_project', 'bookings')
    op.drop_table('bookings')
