//! The session table's unit tests: admission, release, cancellation, the
//! queue, abandoned ids, the byte budget and the restart window.

use super::*;
use crate::wire::id::IdKey;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The settings of most tests: no restart window (their sessions never
/// start through the table).
fn config(on_duplicate: OnDuplicate) -> Config {
    Config {
        on_duplicate,
        max_in_flight_per_session: 8,
        restart_window: Duration::ZERO,
        ..Config::default()
    }
}

fn admit(table: &Arc<Table>, ids: &[&str], policy: OnDuplicate) -> Admission {
    table.admit(b"session-a", ids, ids.len() > 1, &config(policy))
}

fn assert_drained(table: &Table) {
    let stats = table.stats();
    assert_eq!((stats.in_flight_requests, stats.tracked_sessions), (0, 0));
}

/// Ends a registration as a finished exchange (dropping it abandons it).
fn end(admission: Admission) {
    match admission {
        Admission::Admitted { registration, .. } | Admission::Queued { registration, .. } => {
            registration.complete()
        }
        Admission::Duplicate { .. }
        | Admission::OverCapacity
        | Admission::OverBudget
        | Admission::SessionIdTooLong => {}
    }
}

#[test]
fn remap_then_release_frees_everything() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Remap);
    let second = admit(&table, &["\"1\""], OnDuplicate::Remap);
    let Admission::Admitted { routes, .. } = &second else {
        panic!("admitted expected")
    };
    assert!(
        matches!(
            routes[0],
            Route::Remapped {
                duplicate: true,
                ..
            }
        ),
        "the string \"1\" collides with 1"
    );
    assert_eq!(table.stats().in_flight_requests, 2);
    assert_eq!(table.stats().tracked_sessions, 1);
    end(first);
    let third = admit(&table, &["1"], OnDuplicate::Remap);
    let Admission::Admitted { routes, .. } = &third else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "the unchanged slot is free again");
    end(second);
    end(third);
    assert_drained(&table);
}

#[test]
fn under_reject_a_request_remapped_past_a_shadow_still_holds_its_id() {
    let table = Arc::new(Table::new());
    drop(admit(&table, &["1"], OnDuplicate::Reject)); // abandoned: shadows 1
    let second = admit(&table, &["1"], OnDuplicate::Reject);
    assert!(matches!(
        &second,
        Admission::Admitted { routes, .. } if matches!(routes[0], Route::Remapped { duplicate: false, .. })
    ));
    assert!(
        matches!(
            admit(&table, &["1"], OnDuplicate::Reject),
            Admission::Duplicate { .. }
        ),
        "the client already has a request 1 in flight"
    );
    assert!(
        matches!(
            admit(&table, &["1"], OnDuplicate::Queue),
            Admission::Queued { .. }
        ),
        "and under Queue it waits for it"
    );
    end(second);
}

#[test]
fn reject_registers_nothing_and_flags_batch_members() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1"], OnDuplicate::Reject);
    let Admission::Duplicate { colliding } = admit(&table, &["2", "1", "2"], OnDuplicate::Reject)
    else {
        panic!("duplicate expected")
    };
    assert_eq!(colliding, [false, true, true]);
    assert_eq!(table.stats().in_flight_requests, 1);
}

#[test]
fn reserved_ids_are_always_rewritten() {
    let table = Arc::new(Table::new());
    let Admission::Admitted { routes, .. } =
        admit(&table, &["\"mcp-id-guard:forged\""], OnDuplicate::Reject)
    else {
        panic!("admitted expected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
}

#[test]
fn capacity_counts_requests() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1", "2", "3", "4", "5", "6"], OnDuplicate::Remap);
    assert!(matches!(
        admit(&table, &["7", "8", "9"], OnDuplicate::Remap),
        Admission::OverCapacity
    ));
    assert!(matches!(
        admit(&table, &["7", "8"], OnDuplicate::Remap),
        Admission::Admitted { .. }
    ));
    assert!(matches!(
        table.admit(b"session-b", &["1"], false, &config(OnDuplicate::Remap)),
        Admission::Admitted { .. }
    ));
}

#[test]
fn cancel_frees_the_oldest_and_names_its_server_id() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Remap);
    let second = admit(&table, &["1"], OnDuplicate::Remap);
    let Admission::Admitted { routes, .. } = &second else {
        panic!("admitted expected")
    };
    let Route::Remapped { server_id, .. } = &routes[0] else {
        panic!("remapped expected")
    };
    assert_eq!(
        table.cancel(b"session-b", "1"),
        None,
        "other sessions are untouched"
    );
    assert_eq!(
        table.cancel(b"session-a", "\"1\""),
        Some(Arc::from(&b"1"[..])),
        "the oldest, named as the server knows it"
    );
    assert_eq!(table.cancel(b"session-a", "1"), Some(Arc::clone(server_id)));
    assert_eq!(table.cancel(b"session-a", "1"), None);
    let reuse = admit(&table, &["1"], OnDuplicate::Reject);
    let Admission::Admitted { routes, .. } = &reuse else {
        panic!("freed at once")
    };
    assert!(
        matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ),
        "the server may still answer the cancelled one"
    );
    assert_eq!(table.stats().cancelled_total, 2);
    // A server sends no response to a cancelled request: its stream ends
    // without one.
    drop(first);
    end(second);
    end(reuse);
    assert_eq!(
        table.stats().abandoned_ids,
        1,
        "the cancelled request the server knew as 1 may still be answered"
    );
    assert_drained(&table);
}

/// An abandoned request the server knows by the client's id and a live
/// remapped one share the id: the live one is cancelled (the client waits
/// for it), so the id is free again; the abandoned one is named only once no
/// live request has the id.
#[test]
fn cancel_names_a_live_remapped_request_before_an_abandoned_one() {
    let table = Arc::new(Table::new());
    drop(admit(&table, &["1"], OnDuplicate::Reject)); // abandoned as 1
    let live = admit(&table, &["1"], OnDuplicate::Reject);
    let Admission::Admitted { routes, .. } = &live else {
        panic!("admitted expected")
    };
    let Route::Remapped { server_id, .. } = &routes[0] else {
        panic!("remapped past the abandoned id expected")
    };
    assert_eq!(
        table.cancel(b"session-a", "1"),
        Some(Arc::clone(server_id)),
        "the live remapped request, not the abandoned one"
    );
    let reuse = admit(&table, &["1"], OnDuplicate::Reject);
    assert!(
        matches!(&reuse, Admission::Admitted { routes, .. } if matches!(routes[0], Route::Remapped { duplicate: false, .. })),
        "the cancelled request no longer holds the id: {reuse:?}"
    );
    end(reuse);
    assert_eq!(
        table.cancel(b"session-a", "1").as_deref(),
        Some(&b"1"[..]),
        "no live request left: the abandoned one, as the server knows it"
    );
    assert_eq!(table.cancel(b"session-a", "1"), None);
    end(live);
    assert_drained(&table);
}

#[test]
fn queue_hands_the_id_over_in_order() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let Admission::Queued {
        registration: second,
        ticket: second_ticket,
    } = admit(&table, &["1"], OnDuplicate::Queue)
    else {
        panic!("queued expected")
    };
    let Admission::Queued {
        registration: third,
        ticket: third_ticket,
    } = admit(&table, &["1"], OnDuplicate::Queue)
    else {
        panic!("queued expected")
    };
    let mut cx = Context::from_waker(Waker::noop());
    assert!(second_ticket.poll_turn(&mut cx).is_pending());
    end(first);
    assert_eq!(second_ticket.poll_turn(&mut cx), Poll::Ready(None));
    assert!(third_ticket.poll_turn(&mut cx).is_pending());
    assert_eq!(table.stats().in_flight_requests, 2);
    second.complete();
    assert_eq!(third_ticket.poll_turn(&mut cx), Poll::Ready(None));
    third.complete();
    assert_drained(&table);
}

#[test]
fn a_queued_request_that_leaves_frees_its_place() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let Admission::Queued {
        registration: second,
        ..
    } = admit(&table, &["1"], OnDuplicate::Queue)
    else {
        panic!("queued expected")
    };
    let Admission::Queued {
        registration: third,
        ticket,
    } = admit(&table, &["1"], OnDuplicate::Queue)
    else {
        panic!("queued expected")
    };
    drop(second);
    end(first);
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(ticket.poll_turn(&mut cx), Poll::Ready(None));
    third.complete();
    assert_drained(&table);
}

#[test]
fn a_batch_with_a_duplicate_is_refused_under_queue() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1"], OnDuplicate::Queue);
    assert!(matches!(
        admit(&table, &["1", "2"], OnDuplicate::Queue),
        Admission::Duplicate { .. }
    ));
}

#[test]
fn an_abandoned_id_shadows_its_reuse_until_it_expires() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Reject);
    drop(first); // abandoned: never completed
    let stats = table.stats();
    assert_eq!(
        (
            stats.in_flight_requests,
            stats.tracked_sessions,
            stats.abandoned_ids
        ),
        (0, 0, 1)
    );
    let Admission::Admitted {
        registration,
        routes,
    } = admit(&table, &["1"], OnDuplicate::Reject)
    else {
        panic!("reuse after abandoning is never rejected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
    registration.complete();

    let short = Config {
        abandoned_id_ttl: Duration::from_nanos(1),
        ..config(OnDuplicate::Reject)
    };
    let table = Arc::new(Table::new());
    let Admission::Admitted { registration, .. } = table.admit(b"s", &["1"], false, &short) else {
        panic!("admitted expected")
    };
    drop(registration);
    std::thread::sleep(Duration::from_millis(1));
    let Admission::Admitted {
        registration,
        routes,
    } = table.admit(b"s", &["1"], false, &short)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "expired");
    assert_eq!(table.stats().abandoned_ids, 0);
    registration.complete();
    assert_drained(&table);
}

#[test]
fn completed_exchanges_leave_nothing_behind() {
    let table = Arc::new(Table::new());
    let Admission::Admitted { registration, .. } = admit(&table, &["1", "2"], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    registration.complete();
    assert_eq!(table.stats().abandoned_ids, 0);
    let session_hash = table.hasher.hash_one(&b"session-a"[..]);
    assert!(table.shard(session_hash).sessions.is_empty());
}

#[test]
fn a_cancelled_request_shadows_its_id_even_after_its_stream_ended() {
    let short = Config {
        abandoned_id_ttl: Duration::from_millis(1),
        ..config(OnDuplicate::Reject)
    };
    let table = Arc::new(Table::new());
    let admit = |table: &Arc<Table>| table.admit(b"s", &["1"], false, &short);
    let first = admit(&table);
    assert!(table.cancel(b"s", "1").is_some());
    let Admission::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("reuse after a cancellation is never rejected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
    registration.complete();
    // The server closed the cancelled request's stream without a response,
    // but a handler that ignores cancellation may still answer it.
    drop(first);
    assert_eq!(table.stats().abandoned_ids, 1);
    let Admission::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("admitted expected")
    };
    assert!(
        matches!(routes[0], Route::Remapped { .. }),
        "still shadowed"
    );
    registration.complete();
    std::thread::sleep(Duration::from_millis(5));
    let Admission::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "the shadow expired");
    registration.complete();
    assert_drained(&table);
    assert_eq!(table.stats().abandoned_ids, 0);
}

#[test]
fn a_cancellation_names_the_client_id_as_it_was_written() {
    let long = "\"a-request-id-longer-than-an-inline-key\"";
    let cases = [
        ("7", "\"7\""),
        ("\"abc\"", "\"abc\""),
        ("\"\\u0061\"", "\"a\""),
        ("-0", "0"),
        ("\"a\\\"b\"", "\"a\\\"b\""),
        (long, long),
        (
            "123456789012345678901234567890",
            "\"123456789012345678901234567890\"",
        ),
    ];
    for (written, cancelled_as) in cases {
        let table = Arc::new(Table::new());
        let held = admit(&table, &[written], OnDuplicate::Remap);
        assert!(matches!(&held, Admission::Admitted { routes, .. } if routes[0] == Route::AsIs));
        assert_eq!(
            table.cancel(b"session-a", cancelled_as).as_deref(),
            Some(written.as_bytes()),
            "{written} cancelled as {cancelled_as}"
        );
        end(held);
    }
}

#[test]
fn long_ids_collide_by_key_within_a_batch_and_across_posts() {
    let table = Arc::new(Table::new());
    let long = "\"a-request-id-longer-than-an-inline-key\"";
    let Admission::Admitted {
        registration,
        routes,
    } = admit(&table, &[long, "1", long], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs);
    assert_eq!(routes[1], Route::AsIs);
    assert!(matches!(
        routes[2],
        Route::Remapped {
            duplicate: true,
            ..
        }
    ));
    let Admission::Duplicate { colliding } = admit(&table, &["2", long], OnDuplicate::Reject)
    else {
        panic!("duplicate expected")
    };
    assert_eq!(colliding, [false, true]);
    registration.complete();
    assert_drained(&table);
    let Admission::Admitted {
        registration,
        routes,
    } = admit(&table, &[long], OnDuplicate::Reject)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "released");
    registration.complete();
    assert_drained(&table);
}

#[test]
fn stats_count_every_shard() {
    let table = Arc::new(Table::new());
    let sessions: Vec<String> = (0..500).map(|n| format!("session-{n}")).collect();
    let held: Vec<Admission> = sessions
        .iter()
        .map(|session| {
            table.admit(
                session.as_bytes(),
                &["1", "2"],
                true,
                &config(OnDuplicate::Remap),
            )
        })
        .collect();
    let stats = table.stats();
    assert_eq!(
        (stats.in_flight_requests, stats.tracked_sessions),
        (1000, 500)
    );
    assert_eq!((stats.passed_total, stats.remapped_total), (1000, 0));
    let used = table
        .shards
        .iter()
        .filter(|shard| !shard.0.lock().unwrap().sessions.is_empty())
        .count();
    assert!(used > SHARDS / 2, "sessions spread over the shards: {used}");
    held.into_iter().for_each(end);
    assert_drained(&table);
    assert!(table
        .shards
        .iter()
        .all(|shard| shard.0.lock().unwrap().sessions.is_empty()));
}

#[test]
fn rewrite_all_ids_rewrites_unique_ids_too() {
    let table = Arc::new(Table::new());
    let config = Config {
        rewrite_all_ids: true,
        ..config(OnDuplicate::Remap)
    };
    let Admission::Admitted { routes, .. } = table.admit(b"s", &["1", "2"], true, &config) else {
        panic!("admitted expected")
    };
    assert!(routes.iter().all(|route| matches!(
        route,
        Route::Remapped {
            duplicate: false,
            ..
        }
    )));
}

/// Every way in and out of the table charges and refunds the same bytes:
/// once nothing is in flight, queued or abandoned, the table holds none.
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
    assert!(matches!(queued, Admission::Queued { .. }));
    let left = table.admit(&long_session, &["1"], false, &short);
    drop(left); // leaves the queue
    assert!(table.cancel(&long_session, "0").is_some());
    end(first); // grants the queued one
    let Admission::Queued {
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
    assert!(matches!(held, Admission::Admitted { .. }));
    let stats = table.stats();
    assert!(stats.abandoned_evicted_total > 0, "{stats:?}");
    assert!(stats.table_bytes <= config.max_table_bytes, "{stats:?}");
    let reuse = |n: usize| {
        let session = format!("session-{n}");
        let Admission::Admitted {
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
            admitted @ Admission::Admitted { .. } => held.push(admitted),
            Admission::OverBudget => break,
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
        Admission::SessionIdTooLong
    ));
    assert!(matches!(
        table.admit(b"12345678", &["1"], false, &config),
        Admission::Admitted { .. }
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
        let Admission::Admitted {
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
    let Admission::Admitted {
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
    let Admission::Admitted { routes, .. } = admit(&table, &["2"], OnDuplicate::Reject) else {
        panic!("admitted expected")
    };
    assert!(matches!(routes[0], Route::AsIs), "2 was answered");
}

/// A queued request whose turn came but that was never handed to the server
/// (its client left first) leaves nothing behind: the server never saw it.
#[test]
fn a_granted_request_never_forwarded_is_not_abandoned() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let queued = admit(&table, &["1"], OnDuplicate::Queue);
    assert!(matches!(queued, Admission::Queued { .. }));
    end(first); // grants the queued one
    drop(queued);
    assert_eq!(table.stats().abandoned_ids, 0);
    let Admission::Admitted { routes, .. } = admit(&table, &["1"], OnDuplicate::Queue) else {
        panic!("admitted expected")
    };
    assert!(matches!(routes[0], Route::AsIs), "1 goes as it is");
}

/// A request never sent upstream is released outright.
#[test]
fn an_unsent_request_is_not_abandoned() {
    let table = Arc::new(Table::new());
    let Admission::Admitted { registration, .. } = admit(&table, &["1"], OnDuplicate::Remap) else {
        panic!("admitted expected")
    };
    registration.unsent();
    assert_eq!(table.stats().abandoned_ids, 0);
    assert_drained(&table);
}

/// An abandoned id is freed by its answer on another stream of its session
/// (a resumed GET), and only in that session.
#[test]
fn an_answer_on_another_stream_frees_an_abandoned_id() {
    let table = Arc::new(Table::new());
    drop(admit(&table, &["1"], OnDuplicate::Remap));
    assert_eq!(table.stats().abandoned_ids, 1);
    table.answered_elsewhere(b"session-b", "1");
    table.answered_elsewhere(b"session-a", "2");
    assert_eq!(
        table.stats().abandoned_ids,
        1,
        "another session, another id"
    );
    // While abandoned, a new 1 goes remapped: the server runs one request
    // under 1 at most.
    let second = admit(&table, &["1"], OnDuplicate::Remap);
    let Admission::Admitted { routes, .. } = &second else {
        panic!("admitted expected")
    };
    assert!(matches!(routes[0], Route::Remapped { .. }));
    table.answered_elsewhere(b"session-a", "1");
    assert_eq!(table.stats().abandoned_ids, 0);
    end(second);
    let Admission::Admitted { routes, .. } = admit(&table, &["1"], OnDuplicate::Remap) else {
        panic!("admitted expected")
    };
    assert!(matches!(routes[0], Route::AsIs), "1 is free");
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
            matches!(held, Admission::Admitted { .. }),
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
enum Ending {
    Answered,
    HalfAnswered,
    Dropped,
    Cancelled,
}

/// The entries and ids examined per request to admit and end one POST of
/// `size` requests (distinct ids, or all the same one), after a POST of as
/// many requests with the same ids is left in flight, and then to admit and
/// end `size` lone requests with the first id beside them.
fn examined_per_request(config: &Config, size: usize, one_id: bool, ending: Ending) -> f64 {
    let table = Arc::new(Table::new());
    let texts: Vec<String> = (0..size)
        .map(|n| if one_id { 1 } else { n }.to_string())
        .collect();
    let ids: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (answered, cancel) = match ending {
        Ending::Answered => (size, false),
        Ending::HalfAnswered => (size / 2, false),
        Ending::Dropped => (0, false),
        Ending::Cancelled => (0, true),
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
                    Ending::Answered,
                    Ending::HalfAnswered,
                    Ending::Dropped,
                    Ending::Cancelled,
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
