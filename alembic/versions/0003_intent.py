"""Stored intent: each job's plan (slots, prices, batch split) recorded at launch, by revision

Jobs recorded before this revision have no row; the controller plans them once on their next pass and
stores that (store.queries.job_plan), so they keep running across the upgrade.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('intents',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('plan', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'revision', name='uq_intents_job_revision')
    )
    with op.batch_alter_table('intents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_intents_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('intents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_intents_job_id'))
    op.drop_table('intents')
