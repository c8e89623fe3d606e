"""snapshot store: status, problem, project, sizes as 64-bit, what the dump saw

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots", schema=None) as b:
        b.alter_column("size", existing_type=sa.Integer(), type_=sa.BigInteger(),
                       existing_nullable=False)
        b.add_column(sa.Column("project", sa.String(length=200), nullable=False,
                               server_default=""))
        b.add_column(sa.Column("status", sa.String(length=20), nullable=False,
                               server_default="ok"))
        b.add_column(sa.Column("problem", sa.Text(), nullable=False, server_default=""))
        b.add_column(sa.Column("raw_size", sa.BigInteger(), nullable=False, server_default="0"))
        b.add_column(sa.Column("seconds", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("detail", sa.JSON(), nullable=False,
                               server_default=sa.text("'{}'")))
        b.add_column(sa.Column("changed_at", sa.Float(), nullable=True))
        b.create_index(b.f("ix_snapshots_project"), ["project"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("snapshots", schema=None) as b:
        b.drop_index(b.f("ix_snapshots_project"))
        for col in ("changed_at", "detail", "seconds", "raw_size", "problem", "status",
                    "project"):
            b.drop_column(col)
        b.alter_column("size", existing_type=sa.BigInteger(), type_=sa.Integer(),
                       existing_nullable=False)
