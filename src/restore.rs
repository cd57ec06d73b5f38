//! Restoring client ids in JSON-RPC responses. Used for `application/json`
//! bodies and for each SSE event's data, so both paths restore identically.

use crate::edit::Edit;
use crate::envelope::{peek, Kind};
use crate::id::{id_key, restore, IdKey};

/// What the response path learns from one message (or batch).
#[derive(Debug, Default)]
pub(crate) struct Responses {
    /// Edits that put back client ids.
    pub(crate) edits: Vec<Edit>,
    /// The collision keys of the client ids of the JSON-RPC responses seen,
    /// restored ones included: which requests have been answered.
    pub(crate) answered: Vec<IdKey>,
}

/// Peeks once at `json` and finds its JSON-RPC responses: the edits that
/// restore client ids, and the keys of the ids answered.
pub(crate) fn inspect_responses(json: &[u8]) -> Responses {
    let mut found = Responses::default();
    let Some(peeked) = peek(json) else {
        return found;
    };
    for message in peeked.messages() {
        let Some(range) = message
            .id
            .clone()
            .filter(|_| message.kind == Kind::Response)
        else {
            continue;
        };
        // The peeker only hands out ranges of valid JSON tokens, which are UTF-8.
        let Ok(raw) = std::str::from_utf8(&json[range.clone()]) else {
            continue;
        };
        match restore(raw) {
            Some(original) => {
                found.answered.push(id_key(&original));
                found.edits.push((range, original.into_bytes()));
            }
            None => found.answered.push(id_key(raw)),
        }
    }
    found
}

/// The edits that put back the client's original id in every JSON-RPC
/// response of `json` (a single message or a batch) whose top-level `id` is a
/// server-side id. Requests and notifications (server→client), nested
/// occurrences of the prefix and everything else are left alone.
pub(crate) fn restore_edits(json: &[u8]) -> Vec<Edit> {
    inspect_responses(json).edits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::splice;
    use crate::id::IdMinter;

    #[test]
    fn restores_only_top_level_response_ids() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint(r#""x""#)).unwrap();
        let response =
            format!(r#"{{"jsonrpc":"2.0","id":{server_id},"result":{{"id":{server_id}}}}}"#);
        let restored = splice(response.as_bytes(), &restore_edits(response.as_bytes()));
        let expected = format!(r#"{{"jsonrpc":"2.0","id":"x","result":{{"id":{server_id}}}}}"#);
        assert_eq!(String::from_utf8(restored).unwrap(), expected);

        let request =
            format!(r#"{{"jsonrpc":"2.0","id":{server_id},"method":"sampling/createMessage"}}"#);
        assert!(restore_edits(request.as_bytes()).is_empty());
    }

    #[test]
    fn restores_each_response_of_a_batch() {
        let minter = IdMinter::new();
        let a = String::from_utf8(minter.mint("1")).unwrap();
        let b = String::from_utf8(minter.mint("2")).unwrap();
        let batch =
            format!(r#"[{{"id":{a},"result":1}},{{"id":7,"result":2}},{{"id":{b},"error":{{}}}}]"#);
        let restored = splice(batch.as_bytes(), &restore_edits(batch.as_bytes()));
        assert_eq!(
            String::from_utf8(restored).unwrap(),
            r#"[{"id":1,"result":1},{"id":7,"result":2},{"id":2,"error":{}}]"#
        );
    }
}
