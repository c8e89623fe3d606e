"""notice delivery preferences: per user, a webhook URL and / or an e-mail address that get
each notice outside JupyterLab (``notice_prefs``); notices recorded from now on are
delivered (the ``notices.delivered`` mark starts at the last decision)

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'notice_prefs',
        sa.Column('user', sa.String(200), primary_key=True),
        sa.Column('webhook', sa.Text(), nullable=True),
        sa.Column('email', sa.String(320), nullable=True),
        sa.Column('changed_at', sa.Float(), nullable=False))
    # notices are delivered from here on: the history is not sent
    op.execute("INSERT INTO service_state (key, value) SELECT 'notices.delivered', "
               "CAST(COALESCE(MAX(id), 0) AS VARCHAR(20)) FROM decisions")


def downgrade() -> None:
    op.execute("DELETE FROM service_state WHERE key = 'notices.delivered'")
    op.drop_table('notice_prefs')
