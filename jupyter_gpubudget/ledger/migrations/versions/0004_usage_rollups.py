"""hourly usage rollups per project, filled from the closed charge intervals

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'usage_rollups',
        sa.Column('project', sa.String(length=200), nullable=False),
        sa.Column('hour', sa.Float(), nullable=False),
        sa.Column('gpu_ms', sa.Float(), nullable=False),
        sa.Column('last_end', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('project', 'hour'))
    op.create_index('ix_rollup_hour', 'usage_rollups', ['hour'])
    # the cycle reads the latest finished runs for runtime prediction
    op.create_index('ix_workloads_state_ended', 'workloads', ['state', 'ended_at'])
    # the history so far, bucketed once
    from jupyter_gpubudget.ledger.rollups import split_by_hour

    conn = op.get_bind()
    buckets: dict[tuple[str, float], list[float]] = {}
    rows = conn.execute(sa.text('SELECT project, milli, start, "end" FROM charge_intervals '
                                'WHERE "end" IS NOT NULL'))
    for project, milli, start, end in rows:
        for hour, gpu_ms, stop in split_by_hour(milli, start, max(end, start)):
            b = buckets.setdefault((project, hour), [0.0, stop])
            b[0] += gpu_ms
            b[1] = max(b[1], stop)
    table = sa.table('usage_rollups', sa.column('project'), sa.column('hour'),
                     sa.column('gpu_ms'), sa.column('last_end'))
    items = [{'project': p, 'hour': h, 'gpu_ms': v[0], 'last_end': v[1]}
             for (p, h), v in buckets.items()]
    for i in range(0, len(items), 10000):
        op.bulk_insert(table, items[i:i + 10000])


def downgrade() -> None:
    op.drop_index('ix_workloads_state_ended', 'workloads')
    op.drop_table('usage_rollups')
