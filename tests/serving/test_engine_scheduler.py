"""The slot table's placement rule (pure Python): a request goes in at the cursor when its bucket fits before it and
its new tokens after it; otherwise the rows shift left as far as the live requests allow, or it waits."""
from torch_stablehlo.serving.scheduler import SlotTable


def test_a_request_goes_in_at_the_cursor_when_it_fits():
    table = SlotTable(slots=2, max_cache_len=64, cursor=16, compact_at=100)
    assert table.shift_for(bucket=16, max_new_tokens=48) == 0
    assert table.insert(prompt_len=5, max_new_tokens=48) == 0
    assert (table.live[0].start, table.live[0].last_column) == (11, 63)
    assert table.shift_for(bucket=16, max_new_tokens=49) is None  # one token past the end; the live one holds 11


def test_rows_shift_left_as_far_as_the_live_requests_allow():
    table = SlotTable(slots=3, max_cache_len=64, cursor=16, compact_at=100)
    table.insert(prompt_len=4, max_new_tokens=40)  # columns 12 to 55
    for _ in range(30):
        table.stepped()
    assert table.cursor == 46
    assert table.shift_for(bucket=8, max_new_tokens=20) == 12  # needs 2 columns; all 12 before the live one go
    table.shifted(12)
    assert (table.cursor, table.live[0].start, table.live[0].last_column) == (34, 0, 43)
    assert table.shift_for(bucket=8, max_new_tokens=40) is None  # would need 10 more columns than can go


def test_an_idle_table_moves_either_way_and_compacts():
    table = SlotTable(slots=1, max_cache_len=64, cursor=8, compact_at=16)
    assert table.shift_for(bucket=16, max_new_tokens=8) == -8  # the cursor moves right to the bucket
    table.cursor = 40
    assert table.shift_for(bucket=16, max_new_tokens=8) == 24  # 24 columns of nothing before it: compacted
    slot = table.insert(prompt_len=3, max_new_tokens=8)
    table.release(slot)
    assert table.free == [slot] and table.busy == 0


def test_shifts_leave_the_cursor_at_the_floor_so_a_longer_prompt_still_fits():
    def after_a_short_prompt(floor):
        table = SlotTable(slots=3, max_cache_len=64, cursor=16, compact_at=8, floor=floor)
        table.release(table.insert(prompt_len=4, max_new_tokens=40))
        table.cursor = 36  # the first request ran 20 steps and ended
        shift = table.shift_for(bucket=8, max_new_tokens=20)
        table.shifted(shift)
        table.insert(prompt_len=5, max_new_tokens=20)
        return shift, table.shift_for(bucket=16, max_new_tokens=20)

    assert after_a_short_prompt(floor=16) == (20, 0)  # the cursor stays at the longest bucket: the next goes in
    assert after_a_short_prompt(floor=None) == (28, None)  # at the short bucket: it waits for the live one to end
