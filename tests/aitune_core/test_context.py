import threading

from aitune_core.context import BATCH_SIZE_KEY, current_batch_size, global_context


def test_set_get_inside_block_and_restore():
    assert current_batch_size() is None
    with global_context:
        global_context.set(BATCH_SIZE_KEY, 4)
        assert global_context.get(BATCH_SIZE_KEY) == 4
        assert current_batch_size() == 4
        with global_context:
            assert current_batch_size() == 4  # inherited
            global_context.set(BATCH_SIZE_KEY, 8)
            assert current_batch_size() == 8
        assert current_batch_size() == 4
    assert current_batch_size() is None
    assert global_context.get("missing", "dflt") == "dflt"


def test_restored_after_exception():
    try:
        with global_context:
            global_context.set(BATCH_SIZE_KEY, 2)
            raise ValueError
    except ValueError:
        pass
    assert current_batch_size() is None


def test_invalid_batch_sizes_read_as_unknown():
    with global_context:
        global_context.set(BATCH_SIZE_KEY, 0)
        assert current_batch_size() is None
        global_context.set(BATCH_SIZE_KEY, True)
        assert current_batch_size() is None


def test_threads_do_not_see_each_others_values():
    seen = {}
    barrier = threading.Barrier(2)

    def worker(n):
        with global_context:
            global_context.set(BATCH_SIZE_KEY, n)
            barrier.wait()
            seen[n] = current_batch_size()
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {3: 3, 5: 5}
    assert current_batch_size() is None

    with global_context:
        global_context.set(BATCH_SIZE_KEY, 7)
        other = []
        t = threading.Thread(target=lambda: other.append(current_batch_size()))
        t.start()
        t.join()
        assert other == [None]
