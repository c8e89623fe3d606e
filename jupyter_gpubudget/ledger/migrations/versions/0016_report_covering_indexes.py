"""usage reports read their rollups from covering indexes: a period's days
(``ix_usage_daily_cover``) and the hours a local day takes from a neighbouring UTC day
(``ix_usage_hourly_hod`` now holds the figures), so a year's report reads no table rows; the
idlest sessions are the first rows of ``ix_busy_charges_idle`` (``busy_charges.idle_ms``, kept
with the measured and busy figures)

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

FIGS = ['charged_ms', 'measured_ms', 'busy_ms']


def upgrade() -> None:
    with op.batch_alter_table('busy_charges') as b:
        b.add_column(sa.Column('idle_ms', sa.Float(), nullable=False, server_default='0'))
    op.execute("UPDATE busy_charges SET idle_ms = measured_ms - busy_ms")
    op.create_index('ix_busy_charges_idle', 'busy_charges',
                    ['kind', 'idle_ms', 'last', 'first', 'project', 'user', 'workload'])
    op.create_index('ix_usage_daily_cover', 'usage_daily',
                    ['day', 'project', 'user', *FIGS, 'preemptions'])
    op.drop_index('ix_usage_hourly_hod', 'usage_hourly')
    op.create_index('ix_usage_hourly_hod', 'usage_hourly',
                    ['hod', 'hour', 'project', 'user', *FIGS])


def downgrade() -> None:
    op.drop_index('ix_usage_hourly_hod', 'usage_hourly')
    op.create_index('ix_usage_hourly_hod', 'usage_hourly', ['hod', 'hour'])
    op.drop_index('ix_usage_daily_cover', 'usage_daily')
    op.drop_index('ix_busy_charges_idle', 'busy_charges')
    with op.batch_alter_table('busy_charges') as b:
        b.drop_column('idle_ms')
