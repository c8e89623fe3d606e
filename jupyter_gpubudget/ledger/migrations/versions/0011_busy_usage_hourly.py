"""busy GPU time per charge interval (``busy_charges``) and charged / busy GPU time per
project, per user, per hour (``usage_hourly``), kept past the usage window for reports;
filled with the charged history so far (nothing measured it: its busy time is unknown)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'busy_charges',
        sa.Column('charge', sa.Integer(), sa.ForeignKey('charge_intervals.id'),
                  primary_key=True),
        sa.Column('workload', sa.String(64), nullable=False),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('kind', sa.String(20), nullable=False, server_default=''),
        sa.Column('measured_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('busy_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('first', sa.Float(), nullable=False),
        sa.Column('last', sa.Float(), nullable=False),
        sa.Column('source', sa.String(20), nullable=False, server_default=''))
    op.create_index('ix_busy_charges_workload', 'busy_charges', ['workload'])
    op.create_index('ix_busy_charges_last', 'busy_charges', ['last'])
    hourly = op.create_table(
        'usage_hourly',
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('hour', sa.BigInteger(), nullable=False),
        sa.Column('charged_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('measured_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('busy_ms', sa.Float(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('project', 'user', 'hour'))
    op.create_index('ix_usage_hourly_hour', 'usage_hourly', ['hour'])
    from jupyter_gpubudget.ledger.rollups import split_by_hour

    buckets: dict[tuple[str, str, int], float] = {}
    rows = op.get_bind().execute(sa.text(
        'SELECT project, "user", milli, start, "end" FROM charge_intervals '
        'WHERE "end" IS NOT NULL'))
    for project, user, milli, start, end in rows:
        for hour, ms, _stop in split_by_hour(milli, start, max(end, start)):
            key = (project, user, int(hour))
            buckets[key] = buckets.get(key, 0.0) + ms
    items = [{'project': p, 'user': u, 'hour': h, 'charged_ms': v, 'measured_ms': 0.0,
              'busy_ms': 0.0} for (p, u, h), v in buckets.items()]
    for i in range(0, len(items), 10000):
        op.bulk_insert(hourly, items[i:i + 10000])


def downgrade() -> None:
    op.drop_index('ix_usage_hourly_hour', table_name='usage_hourly')
    op.drop_table('usage_hourly')
    op.drop_index('ix_busy_charges_last', table_name='busy_charges')
    op.drop_index('ix_busy_charges_workload', table_name='busy_charges')
    op.drop_table('busy_charges')
