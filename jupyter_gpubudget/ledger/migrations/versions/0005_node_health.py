"""node health: what a health source or an admin decided about a node, and when it drained

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_health",
        sa.Column("node", sa.String(length=200), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=40), nullable=False),
        sa.Column("changed_by", sa.String(length=200), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.Column("drained_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("node"),
    )


def downgrade() -> None:
    op.drop_table("node_health")
