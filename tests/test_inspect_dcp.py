# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window inspector under decode context parallelism (`--dcp N`): every rank's build,
its per-rank columns, its checks and its errors."""

import shlex

import pytest
import torch

from tools.inspector import dcp as inspector_dcp
from tools.inspector import inspector
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent


def inspect(flags: str) -> int:
    """The inspector's command line, ``flags`` as typed (without the served study)."""
    return inspector.main([*shlex.split(flags), "--no-serve"])


@pytest.fixture(autouse=True)
def uninstall_after():
    yield
    plugin.unregister()


def table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]


def rank_shares(row: list[str], cp: int) -> list[tuple[int, int]]:
    """(tokens read, tokens of the context) of each rank: the columns after `windowed`."""
    return [tuple(int(x) for x in cell.split("/")) for cell in row[5 : 5 + cp]]


@pytest.mark.parametrize(("cp", "interleave"), [(2, 1), (4, 1), (4, 8)])
def test_every_rank_reads_its_share_of_the_window(cp, interleave, capsys):
    code = inspector.main(
        [
            "--window",
            "256",
            "--seq-lens",
            "5,100,1000,5000",
            "--block-sizes",
            "16,32",
            "--method",
            "dspark",
            "--method",
            "eagle3",
            "--dcp",
            str(cp),
            "--dcp-interleave",
            str(interleave),
            "--no-serve",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    # A sharded table's column spans cp blocks: the alignment is lcm(cp 16, cp 32).
    assert f"block sizes [16, 32], alignment {cp * 32}" in out
    assert f"decode_context_parallel_size={cp}, cp_kv_cache_interleave_size={interleave}" in out
    assert all(f"rank {r} read/full" in out for r in range(cp))
    rows = table_rows(out)
    assert len(rows) == 8 and all(row[-1] == "ok" for row in rows)
    for row in rows:
        seq_len, start, windowed = int(row[1]), int(row[3]), int(row[4])
        shares = rank_shares(row, cp)
        # The ranks' reads are the windowed length split, their contexts the whole one.
        assert sum(read for read, _ in shares) == windowed
        assert sum(full for _, full in shares) == seq_len
        assert start % (cp * 32) == 0
    # dspark, 5000-token context (+4 query tokens): start 4736 = floor((5004 - 256) / 64) * 64
    # for cp 2 (and / 128 * 128 for cp 4), 268 tokens read, split by the interleave.
    assert rows[3][:5] == ["5000", "5004", "yes", "4736", "268"]
    expected = {
        (2, 1): [(134, 2502), (134, 2502)],
        (4, 1): [(67, 1251)] * 4,
        # Rounds of 4 x 8 tokens: 268 = 8 rounds + 12 (8 to rank 0, 4 to rank 1); 5004 =
        # 156 rounds + 12.
        (4, 8): [(72, 1256), (68, 1252), (64, 1248), (64, 1248)],
    }[cp, interleave]
    assert rank_shares(rows[3], cp) == expected


def test_the_ranks_read_the_sinks_beside_the_window(capsys):
    code = inspect(
        "--window 256 --sinks 20 --seq-lens 300,5000 --block-sizes 16 --method dspark --dcp 2"
    )
    out = capsys.readouterr().out
    assert code == 0
    # The sinks round up to whole columns of both ranks' tables: 32 tokens, 16 on each.
    assert "attention sinks 32 (draft_attention_sinks=20)" in out
    rows = table_rows(out)
    assert all(row[-1] == "ok" for row in rows)
    # 5004 tokens: start 4736 (see above, alignment 32), 32 sinks + 268 recent = 300 read.
    assert rows[1][:5] == ["5000", "5004", "yes", "4736", "300"]
    assert rank_shares(rows[1], 2) == [(150, 2502), (150, 2502)]


def test_the_rank_that_reads_the_most_is_shown_per_rank(capsys):
    """blocks/rank and KV MiB/rank are rank 0's, which holds the first chunk of each round."""
    code = inspect(
        "--window 256 --seq-lens 1000 --block-sizes 16 --method eagle3 --dcp 2 --draft-layers 64"
    )
    out = capsys.readouterr().out
    assert code == 0
    (row,) = table_rows(out)
    # 1001 tokens: start 736, 265 read; rank 0 reads 133 of its 501, rank 1 132 of 500.
    assert row[:5] == ["1000", "1001", "yes", "736", "265"]
    assert rank_shares(row, 2) == [(133, 501), (132, 500)]
    # Rank 0's: 9 blocks of 16 tokens of its 32; a quarter MiB a token (K and V of 64
    # layers, 8 heads of 128, 2 bytes), 33.25 of 125.25 MiB (rank 1: 33.00 of 125.00).
    assert row[7:10] == ["9/32", "33.25/125.25", "3.8x"]


def test_a_window_that_ignores_dcp_is_caught(capsys, monkeypatch):
    """A window aligned to one rank's blocks (the table's columns taken for b tokens, not
    cp b) crops the wrong columns of every rank's table."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import plan

    monkeypatch.setattr(
        plan,
        "column_tokens",
        lambda units, group_ids, layout: {g: int(units[g]) for g in group_ids},
    )
    code = inspect("--window 256 --seq-lens 1000,5000 --block-sizes 16 --method dspark --dcp 2")
    out = capsys.readouterr().out
    assert code == 1
    assert [row[-1] for row in table_rows(out)] == ["FAILED", "FAILED"]


def reference_case(cp: int = 2, b: int = 16, length: int = 1000, read: int = 264):
    """One request of `length` tokens, its window of `read` (start a multiple of cp b), and
    what each rank's kernel is handed for it."""
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    ids = list(range(101, 101 + -(-length // (cp * b))))
    start = length - read
    kept = torch.arange(start, length)
    shares = get_dcp_local_seq_lens(torch.tensor([read]), cp, None, 1)[0].tolist()
    return ids, start, kept, shares


def test_the_reference_check_holds_for_the_right_crop_only():
    ids, start, kept, shares = reference_case()
    column = start // 32
    right = [torch.tensor(ids[column:], dtype=torch.int32)] * 2

    def check(tables, local_lens, kept=kept):
        return inspector_dcp._reference_check(
            ids, 16, 2, 1, 0, 1000, start, 0, kept, 4, tables, local_lens
        )

    assert check(right, shares)
    # One column too late on every rank: the window's first 32 tokens are not read.
    assert not check([t[1:] for t in right], shares)
    # The crop a window aligned to one rank's 16-token blocks hands: start / 16 columns off.
    assert not check([torch.tensor(ids[start // 16 :], dtype=torch.int32)] * 2, shares)
    # A window of odd length (1001 tokens, start 736): rank 0 holds 133 of its 265 tokens,
    # rank 1 132; rank 1 handed 133 reads a token past the context.
    ids, start, kept, shares = reference_case(length=1001, read=265)
    assert shares == [133, 132]
    table = [torch.tensor(ids[start // 32 :], dtype=torch.int32)] * 2
    check = lambda lens: inspector_dcp._reference_check(  # noqa: E731
        ids, 16, 2, 1, 0, 1001, start, 0, kept, 4, table, lens
    )
    assert check(shares) and not check([133, 133]) and not check([133, 131])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dcp", "0"], "--dcp must be a positive integer, got '0'"),
        (["--dcp", "two"], "--dcp must be a positive integer, got 'two'"),
        (["--dcp", "-2"], "--dcp must be a positive integer, got '-2'"),
        (["--dcp", "2", "--dcp-interleave", "0"], "--dcp-interleave must be a positive integer"),
        (
            ["--dcp", "2", "--block-sizes", "16,24", "--dcp-interleave", "16"],
            "--dcp-interleave 16 does not divide the block size 24",
        ),
        (
            ["--dcp", "2", "--dcp-interleave", "3"],
            "--dcp-interleave 3 does not divide the block "
            "size 128: cp_kv_cache_interleave_size must divide every block size",
        ),
        (["--dcp", "2", "--plot", "x.png"], "leave it out with --dcp"),
    ],
)
def test_bad_dcp_flags_stop_with_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        inspector.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
