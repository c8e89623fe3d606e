"""the service's leader lease (active/standby replicas on one PostgreSQL ledger)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'service_leader',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('holder', sa.String(200), nullable=False),
        sa.Column('url', sa.String(1000), nullable=False, server_default=''),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('acquired_at', sa.Float(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('service_leader')
