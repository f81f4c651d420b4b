"""Resilience: per-job error backoff, lease token, fatal exits; persisted capacity blocks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 09:40:00
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

_JOB_COLUMNS = ("lease_token", "fatal_exits", "pass_failures", "failing_since", "retry_at", "last_error")


def _initial() -> ModuleType:
    # The views are defined in 0001; SQLite's batch mode rebuilds the jobs table, so they are recreated.
    spec = importlib.util.spec_from_file_location("_orch_0001", Path(__file__).with_name("0001_initial.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    initial = _initial()
    initial._drop_views()
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_token', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('fatal_exits', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('pass_failures', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('failing_since', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('retry_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('last_error', sa.String(length=500), nullable=True))
    op.create_table('blocks',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('provider', sa.String(length=200), nullable=False),
    sa.Column('scope', sa.String(length=8), nullable=False),
    sa.Column('location', sa.String(length=64), nullable=False),
    sa.Column('resource', sa.String(length=64), nullable=False),
    sa.Column('reason', sa.String(length=500), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('blocks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_blocks_expires_at'), ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_blocks_provider'), ['provider'], unique=False)
    initial._create_views()


def downgrade() -> None:
    initial = _initial()
    initial._drop_views()
    with op.batch_alter_table('blocks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blocks_provider'))
        batch_op.drop_index(batch_op.f('ix_blocks_expires_at'))
    op.drop_table('blocks')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for column in reversed(_JOB_COLUMNS):
            batch_op.drop_column(column)
    initial._create_views()
