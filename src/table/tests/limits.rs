//! The byte budget, session limits, the restart window, what frees an id,
//! and the cost of tracking per request.

use super::*;
use crate::wire::id::IdKey;

#[test]
fn the_budget_is_given_back_exactly() {
    let short = Config {
        abandoned_id_ttl: Duration::from_millis(1),
        ..config(OnDuplicate::Queue)
    };
    let table = Arc::new(Table::new());
    let long_session = vec![b's'; 300];
    let long_id = format!("\"{}\"", "i".repeat(100));
    let first = table.admit(&long_session, &[&long_id, "1", "-0"], true, &short);
    let stats = table.stats();
    assert!(stats.table_bytes > 300 + 100, "{stats:?}");
    let queued = table.admit(&long_session, &["1"], false, &short);
    assert!(matches!(queued, Decision::Queued { .. }));
    let left = table.admit(&long_session, &["1"], false, &short);
    drop(left); // leaves the queue
    assert!(table.cancel(&long_session, "0").is_some());
    end(first); // grants the queued one
    let Decision::Queued {
        registration: mut queued,
        ..
    } = queued
    else {
        panic!("queued expected")
    };
    queued.forwarded(false);
    drop(queued); // abandons it: the server has it
    let remapped = table.admit(&long_session, &["1"], false, &short);
    end(remapped);
    assert!(table.stats().abandoned_ids > 0);
    std::thread::sleep(Duration::from_millis(5));
    table.cancel(&long_session, "1"); // any use of the shard expires them
    let stats = table.stats();
    assert_eq!(stats.abandoned_ids, 0, "{stats:?}");
    assert_eq!(stats.table_bytes, 0, "{stats:?}");
    assert_drained(&table);
}

#[test]
fn a_full_table_forgets_the_oldest_abandoned_ids_first() {
    let table = Arc::new(Table::new());
    let config = Config {
        max_table_bytes: 8192,
        ..config(OnDuplicate::Remap)
    };
    // Abandon ids in distinct sessions until the table is nearly full.
    let mut abandoned = 0;
    while table.stats().table_bytes + 1024 < config.max_table_bytes {
        let session = format!("session-{abandoned}");
        drop(table.admit(session.as_bytes(), &["1"], false, &config));
        abandoned += 1;
    }
    assert!(abandoned > 3);
    assert_eq!(table.stats().abandoned_ids, abandoned);
    // A request that needs room: the oldest abandoned id goes first.
    let long_id = format!("\"{}\"", "x".repeat(1000));
    let held = table.admit(b"newcomer", &[&long_id], false, &config);
    assert!(matches!(held, Decision::Admitted { .. }));
    let stats = table.stats();
    assert!(stats.abandoned_evicted_total > 0, "{stats:?}");
    assert!(stats.table_bytes <= config.max_table_bytes, "{stats:?}");
    let reuse = |n: usize| {
        let session = format!("session-{n}");
        let Decision::Admitted {
            routes,
            registration,
        } = table.admit(session.as_bytes(), &["1"], false, &config)
        else {
            panic!("admitted expected")
        };
        registration.complete();
        routes[0] == Route::AsIs
    };
    assert!(reuse(0), "the oldest was forgotten");
    assert!(!reuse(abandoned - 1), "the newest is still abandoned");
    end(held);
}

#[test]
fn a_request_that_cannot_fit_is_refused_and_registers_nothing() {
    let table = Arc::new(Table::new());
    let config = Config {
        max_table_bytes: 2048,
        max_in_flight_per_session: 1 << 20,
        ..config(OnDuplicate::Remap)
    };
    let mut held = Vec::new();
    loop {
        let id = held.len().to_string();
        match table.admit(b"s", &[&id], false, &config) {
            admitted @ Decision::Admitted { .. } => held.push(admitted),
            Decision::OverBudget => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let stats = table.stats();
    assert!(!held.is_empty());
    assert!(stats.table_bytes <= config.max_table_bytes, "{stats:?}");
    assert_eq!(stats.in_flight_requests, held.len());
    assert_eq!(stats.rejected_total, 1);
    held.into_iter().for_each(end);
    assert_eq!(table.stats().table_bytes, 0);
}

#[test]
fn over_long_session_ids_are_refused() {
    let table = Arc::new(Table::new());
    let config = Config {
        max_session_id_bytes: 8,
        ..config(OnDuplicate::Remap)
    };
    assert!(matches!(
        table.admit(b"123456789", &["1", "2"], true, &config),
        Decision::SessionIdTooLong
    ));
    assert!(matches!(
        table.admit(b"12345678", &["1"], false, &config),
        Decision::Admitted { .. }
    ));
    let stats = table.stats();
    assert_eq!((stats.rejected_total, stats.passed_total), (2, 1));
}

#[test]
fn during_the_restart_window_unseen_sessions_are_remapped() {
    let table = Arc::new(Table::new());
    let window = Config {
        restart_window: Duration::from_secs(60),
        ..config(OnDuplicate::Reject)
    };
    table.note_started(b"seen", &window);
    let route = |session: &[u8], config: &Config| {
        let Decision::Admitted {
            routes,
            registration,
        } = table.admit(session, &["1"], false, config)
        else {
            panic!("admitted expected")
        };
        registration.complete();
        matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        )
    };
    assert!(route(b"unseen", &window), "an unseen session is remapped");
    assert!(!route(b"seen", &window), "a session seen starting is not");
    let stats = table.stats();
    assert_eq!((stats.restart_remapped_total, stats.remapped_total), (1, 1));
    assert_eq!(stats.table_bytes, budget::STARTED);
    // Once the window is over, everything is normal and the set freed.
    let over = Config {
        restart_window: Duration::ZERO,
        ..window
    };
    assert!(!route(b"unseen", &over));
    assert_eq!(table.stats().table_bytes, 0);
    table.note_started(b"late", &over);
    assert_eq!(table.stats().table_bytes, 0, "nothing recorded after it");
}

#[test]
fn session_starts_are_not_recorded_past_the_limits() {
    let table = Arc::new(Table::new());
    let config = Config {
        restart_window: Duration::from_secs(60),
        max_session_id_bytes: 4,
        max_table_bytes: budget::STARTED,
        ..config(OnDuplicate::Remap)
    };
    table.note_started(b"too-long", &config);
    assert_eq!(table.stats().table_bytes, 0);
    table.note_started(b"a", &config);
    table.note_started(b"a", &config);
    table.note_started(b"b", &config);
    assert_eq!(table.stats().table_bytes, budget::STARTED);
}

/// An id is free when its response passed, even after a cancellation (the
/// server is done with it), and abandoned when the exchange ended without
/// it, however it ended.
#[test]
fn only_an_answer_frees_an_id() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Reject);
    assert!(table.cancel(b"session-a", "1").is_some());
    end(first);
    assert_eq!(table.stats().abandoned_ids, 0, "answered after all");

    // A batch whose stream ended after one of its two responses.
    let Decision::Admitted {
        mut registration, ..
    } = admit(&table, &["1", "2"], OnDuplicate::Reject)
    else {
        panic!("admitted expected")
    };
    assert!(registration.note_answered([(IdKey::from("2"), false)]));
    // An answer to a remapped request with the same key is not this one's.
    assert!(registration.note_answered([(IdKey::from("1"), true)]));
    drop(registration);
    assert_eq!(table.stats().abandoned_ids, 1, "1 may still be running");
    assert!(
        remapped_id(&admit(&table, &["2"], OnDuplicate::Reject)).is_none(),
        "2 was answered"
    );
}

/// A queued request whose turn came but that was never handed to the server
/// (its client left first) leaves nothing behind: the server never saw it.
#[test]
fn a_granted_request_never_forwarded_is_not_abandoned() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let queued = admit(&table, &["1"], OnDuplicate::Queue);
    assert!(matches!(queued, Decision::Queued { .. }));
    end(first); // grants the queued one
    drop(queued);
    assert_eq!(table.stats().abandoned_ids, 0);
    assert!(
        remapped_id(&admit(&table, &["1"], OnDuplicate::Queue)).is_none(),
        "1 goes as it is"
    );
}

/// A request never sent upstream is released outright.
#[test]
fn an_unsent_request_is_not_abandoned() {
    let table = Arc::new(Table::new());
    let Decision::Admitted { registration, .. } = admit(&table, &["1"], OnDuplicate::Remap) else {
        panic!("admitted expected")
    };
    registration.unsent();
    assert_eq!(table.stats().abandoned_ids, 0);
    assert_drained(&table);
}

/// An abandoned id is freed by its answer on a resumed GET of the stream
/// its request's own stream ended at, and only there: not by an answer on a
/// stream resumed from elsewhere (a replay of another request's answer), nor
/// in another session.
#[test]
fn an_answer_on_its_resumed_stream_frees_an_abandoned_id() {
    let table = Arc::new(Table::new());
    let Decision::Admitted {
        mut registration, ..
    } = admit(&table, &["1"], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    registration.note_stream(b"7");
    drop(registration);
    assert_eq!(table.stats().abandoned_ids, 1);
    let resumed = table.stream_tag(b"7");
    table.answered_on_resume(b"session-b", b"1", resumed);
    table.answered_on_resume(b"session-a", b"2", resumed);
    table.answered_on_resume(b"session-a", b"1", table.stream_tag(b"6"));
    assert_eq!(
        table.stats().abandoned_ids,
        1,
        "another session, another id, another stream"
    );
    // A request whose stream showed no event id cannot be resumed.
    drop(admit(&table, &["2"], OnDuplicate::Remap));
    table.answered_on_resume(b"session-a", b"2", resumed);
    assert_eq!(table.stats().abandoned_ids, 2);
    // While abandoned, a new 1 goes remapped: the server runs one request
    // under 1 at most.
    let second = admit(&table, &["1"], OnDuplicate::Remap);
    let Decision::Admitted { routes, .. } = &second else {
        panic!("admitted expected")
    };
    assert!(matches!(routes[0], Route::Remapped { .. }));
    table.answered_on_resume(b"session-a", b"1", resumed);
    assert_eq!(table.stats().abandoned_ids, 1, "2 stays abandoned");
    end(second);
    assert!(
        remapped_id(&admit(&table, &["1"], OnDuplicate::Remap)).is_none(),
        "1 is free"
    );
}

/// A resumption's links are charged to the byte budget when a session's
/// first resumed stream goes on, refused (the id stays abandoned) when they
/// do not fit, and given back with the session; a resumption of a resumed
/// stream frees the request whose stream it continues.
#[test]
fn resumption_links_are_charged_and_given_back() {
    let table = Arc::new(Table::new());
    let Decision::Admitted {
        mut registration, ..
    } = admit(&table, &["1"], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    registration.note_stream(b"7");
    drop(registration);
    let held = table.stats().table_bytes;
    let origin = table.resumed_stream(b"session-a", b"7");
    assert_eq!(origin, table.stream_tag(b"7"));
    let tight = Resumed {
        origin,
        max_table_bytes: held,
    };
    table.resumed_to(b"session-a", tight, b"8");
    assert_eq!(table.stats().table_bytes, held, "no room: no link");
    assert_eq!(
        table.resumed_stream(b"session-a", b"8"),
        table.stream_tag(b"8")
    );
    let roomy = Resumed {
        origin,
        max_table_bytes: usize::MAX,
    };
    table.resumed_to(b"session-a", roomy, b"8");
    table.resumed_to(b"session-b", roomy, b"8");
    assert_eq!(
        table.stats().table_bytes,
        held + session::resumptions_cost(),
        "one session's links, none for a session the table does not hold"
    );
    assert_eq!(
        table.resumed_stream(b"session-b", b"8"),
        table.stream_tag(b"8")
    );
    let again = table.resumed_stream(b"session-a", b"8");
    assert_eq!(again, origin, "a resumption of the resumed stream");
    table.answered_on_resume(b"session-a", b"1", again);
    assert_eq!(table.stats().abandoned_ids, 0);
    // The session went with its last entry; what stays is the abandoned
    // id's expiry record, given back when it expires.
    assert_eq!(
        table.stats().table_bytes,
        budget::ABANDONED,
        "the links went with the session"
    );
}

/// A session name of `table` whose shard is none of `taken`'s.
fn session_on_another_shard(table: &Table, taken: &[&str]) -> String {
    let shard_of = |session: &str| shard_index(table.hasher.hash_one(session.as_bytes()));
    (0..10_000)
        .map(|n| format!("session-{n}"))
        .find(|session| {
            taken
                .iter()
                .all(|other| shard_of(other) != shard_of(session))
        })
        .expect("64 shards")
}

/// Abandoned ids expire in a shard that then sees no more traffic: their
/// bytes must not keep the budget full for the other shards, whether the
/// eviction order learns of their expiry when room is needed or earlier,
/// when another shard abandons an id. No live abandoned id is forgotten for
/// room that expired ones hold.
#[test]
fn expired_abandoned_ids_of_an_idle_shard_make_room() {
    let ttl = Duration::from_millis(5);
    let config = Config {
        max_table_bytes: 8192,
        max_in_flight_per_session: 1 << 20,
        abandoned_id_ttl: ttl,
        ..config(OnDuplicate::Remap)
    };
    for another_shard_abandons in [false, true] {
        let table = Arc::new(Table::new());
        let idle = "idle";
        let mut abandoned = 0;
        while table.stats().table_bytes + 1024 < config.max_table_bytes {
            let id = abandoned.to_string();
            drop(table.admit(idle.as_bytes(), &[&id], false, &config));
            abandoned += 1;
        }
        assert!(abandoned > 3);
        // Past every expiry: waiting for the clock, not for another thread.
        let expired_at = Instant::now() + ttl;
        while Instant::now() <= expired_at {
            std::thread::sleep(expired_at - Instant::now() + Duration::from_millis(1));
        }
        let other = session_on_another_shard(&table, &[idle]);
        if another_shard_abandons {
            drop(table.admit(other.as_bytes(), &["1"], false, &config));
        }
        let newcomer = session_on_another_shard(&table, &[idle, &other]);
        let long_id = format!("\"{}\"", "x".repeat(1500));
        let held = table.admit(newcomer.as_bytes(), &[&long_id], false, &config);
        let stats = table.stats();
        assert!(
            matches!(held, Decision::Admitted { .. }),
            "refused ({another_shard_abandons}): {held:?} {stats:?}"
        );
        assert_eq!(stats.abandoned_evicted_total, 0, "{stats:?}");
        assert_eq!(
            stats.abandoned_ids,
            usize::from(another_shard_abandons),
            "{stats:?}"
        );
        end(held);
    }
}

/// How a tracked batch ends, for the cost tests.
#[derive(Debug, Clone, Copy)]
enum Finish {
    Answered,
    HalfAnswered,
    Dropped,
    Cancelled,
}

/// The entries and ids examined per request to admit and end one POST of
/// `size` requests (distinct ids, or all the same one), after a POST of as
/// many requests with the same ids is left in flight, and then to admit and
/// end `size` lone requests with the first id beside them.
fn examined_per_request(config: &Config, size: usize, one_id: bool, ending: Finish) -> f64 {
    let table = Arc::new(Table::new());
    let texts: Vec<String> = (0..size)
        .map(|n| if one_id { 1 } else { n }.to_string())
        .collect();
    let ids: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (answered, cancel) = match ending {
        Finish::Answered => (size, false),
        Finish::HalfAnswered => (size / 2, false),
        Finish::Dropped => (0, false),
        Finish::Cancelled => (0, true),
    };
    examined::take();
    let held = table.admit(b"session-a", &ids, true, config);
    table.track(b"session-a", &ids, answered, cancel, config);
    for _ in 0..size {
        table.track(b"session-a", &ids[..1], answered.min(1), cancel, config);
    }
    drop(held);
    examined::take() as f64 / (3 * size) as f64
}

/// Tracking a batch costs the same per request however large the batch is
/// (no request looks at every other one), for distinct ids and for one id
/// repeated, under every policy, however the batch ends. Counts the entries
/// and ids the table examines rather than timing anything.
#[test]
fn tracking_costs_the_same_per_request_at_any_batch_size() {
    let mut superlinear = Vec::new();
    for on_duplicate in [OnDuplicate::Remap, OnDuplicate::Reject, OnDuplicate::Queue] {
        for rewrite_all_ids in [false, true] {
            let config = Config {
                max_in_flight_per_session: 200_000,
                rewrite_all_ids,
                ..config(on_duplicate)
            };
            for one_id in [false, true] {
                for ending in [
                    Finish::Answered,
                    Finish::HalfAnswered,
                    Finish::Dropped,
                    Finish::Cancelled,
                ] {
                    let small = examined_per_request(&config, 500, one_id, ending);
                    let large = examined_per_request(&config, 8_000, one_id, ending);
                    if large > 2.0 * small.max(1.0) {
                        superlinear.push(format!(
                            "{on_duplicate:?} rewrite_all_ids={rewrite_all_ids} one_id={one_id} \
                             {ending:?}: {small:.1} examined per request at 500, {large:.1} at 8000"
                        ));
                    }
                }
            }
        }
    }
    assert!(superlinear.is_empty(), "{}", superlinear.join("\n"));
}

/// A TTL too long for the clock to add (the binary saturates
/// `--abandoned-id-ttl` to `u64::MAX` seconds) remembers an abandoned id
/// rather than forgetting it at once.
#[test]
fn a_ttl_past_the_clock_remembers_abandoned_ids() {
    let table = Arc::new(Table::new());
    let config = Config {
        abandoned_id_ttl: Duration::MAX,
        ..config(OnDuplicate::Remap)
    };
    drop(table.admit(b"session-a", &["1"], false, &config));
    assert_eq!(table.stats().abandoned_ids, 1, "abandoned, not forgotten");
    let reuse = table.admit(b"session-a", &["1"], false, &config);
    let Decision::Admitted { routes, .. } = &reuse else {
        panic!("admitted expected")
    };
    assert!(
        matches!(routes[0], Route::Remapped { .. }),
        "a reuse of the abandoned id goes with a server-side id"
    );
    let far = registration::expiry(Instant::now(), Duration::MAX);
    assert!(far > Instant::now() + Duration::from_secs(50 * 365 * 24 * 3600));
}

/// A resume can overtake the end of the request's own exchange (a proxy in
/// between still holds it): the answer on it frees the id once the exchange
/// ends at the stream resumed, and only then.
#[test]
fn an_answer_on_a_resume_before_the_exchange_ends_frees_it_at_the_end() {
    for (ends_at, frees) in [(&b"7"[..], true), (&b"8"[..], false)] {
        let table = Arc::new(Table::new());
        let Decision::Admitted {
            mut registration, ..
        } = admit(&table, &["1"], OnDuplicate::Remap)
        else {
            panic!("admitted expected")
        };
        registration.note_stream(b"7");
        table.answered_on_resume(b"session-a", b"1", table.stream_tag(b"7"));
        registration.note_stream(ends_at);
        drop(registration);
        assert_eq!(
            table.stats().abandoned_ids,
            usize::from(!frees),
            "ends at {ends_at:?}"
        );
    }
}
