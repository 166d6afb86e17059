//! Provider settings: the user's stored settings over the embedding
//! extension's defaults (`extension/settings-defaults.js`, `src/settings.rs`).

use serde_json::{json, Map, Value};
use sw_agent::settings::{check_defaults, effective, profile_of};

fn defaults(value: Value) -> Map<String, Value> {
    let (kept, errors) = check_defaults(&value);
    assert!(errors.is_empty(), "{errors:?}");
    kept
}

#[test]
fn the_user_s_stored_settings_win_field_by_field_over_the_extension_s_defaults() {
    let defaults = defaults(json!({
        "provider": "anthropic",
        "baseUrl": "https://llm.example.com/v1",
        "model": "acme-1",
        "maxOutputTokens": 2048,
        "temperature": 0.2,
        "toolUse": false,
        "contextWindow": 200000,
    }));

    // The shortest addresses are addresses; a scheme alone is not.
    assert!(check_defaults(&json!({ "baseUrl": "http://x" }))
        .1
        .is_empty());
    assert_eq!(check_defaults(&json!({ "baseUrl": "https://" })).1.len(), 1);

    // Nothing stored: the defaults alone make a configured profile.
    let (profile, key) = profile_of(&effective(&Value::Null, &defaults));
    assert!(profile.is_configured());
    assert_eq!(profile.kind, "anthropic");
    assert_eq!(profile.base_url, "https://llm.example.com/v1");
    assert_eq!(profile.model, "acme-1");
    assert_eq!(profile.max_output_tokens, Some(2048));
    assert_eq!(profile.temperature_centi, Some(20));
    assert!(!profile.tool_use);
    assert_eq!(profile.context_window, Some(200_000));
    assert_eq!(key, "");

    // A stored value wins; an unset one (absent, null, empty text) does not.
    let stored = json!({
        "apiKey": " sk-user ",
        "model": "acme-2",
        "temperature": null,
        "baseUrl": "  ",
        "toolUse": true,
        "tokenBudget": 50000,
    });
    let (profile, key) = profile_of(&effective(&stored, &defaults));
    assert_eq!(key, "sk-user");
    assert_eq!(profile.model, "acme-2");
    assert_eq!(
        profile.temperature_centi,
        Some(20),
        "null takes the default"
    );
    assert_eq!(
        profile.base_url, "https://llm.example.com/v1",
        "empty text takes the default"
    );
    assert!(profile.tool_use);
    assert_eq!(profile.token_budget, Some(50_000));
    assert_eq!(profile.kind, "anthropic");

    // Stored settings that are not an object are as if nothing was stored.
    let (profile, _) = profile_of(&effective(&json!("damaged"), &defaults));
    assert_eq!(profile.model, "acme-1");

    // Without defaults, an empty store is not configured (`not_configured`).
    let (profile, _) = profile_of(&effective(&Value::Null, &Map::new()));
    assert!(!profile.is_configured());
}

#[test]
fn wrong_settings_defaults_are_left_out_one_by_one_and_named() {
    let (kept, errors) = check_defaults(&json!({
        "provider": "gemini",
        "baseUrl": "ftp://llm.example.com",
        "model": "",
        "apiKey": "sk-shipped",
        "maxOutputTokens": 1.5,
        "temperature": 3,
        "toolUse": "yes",
        "vision": true,
        "contextWindow": 10,
        "tokenBudget": 0,
        "modle": "typo",
        "toolUse2": null,
    }));
    assert_eq!(
        kept,
        defaults(json!({ "vision": true })),
        "only the right field is kept"
    );
    let named = |field: &str, what: &str| {
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&format!("`{field}` ")) && e.contains(what)),
            "{field}: {errors:#?}"
        )
    };
    named("provider", "must be \"openai\" or \"anthropic\"");
    named("baseUrl", "must be an http(s) address");
    named("model", "must be a model name");
    named(
        "apiKey",
        "anyone who installs the extension can read its files",
    );
    named("maxOutputTokens", "whole number from 1 to 1000000");
    named("temperature", "from 0 to 2");
    named("toolUse", "true or false");
    named("contextWindow", "whole number from 1000");
    named("tokenBudget", "whole number from 1");
    named("modle", "is not a settings field");
    assert_eq!(errors.len(), 10, "null is as if absent: {errors:#?}");

    // A shipped key never reaches a request, even with nothing stored.
    let (_, key) = profile_of(&effective(&Value::Null, &kept));
    assert_eq!(key, "");

    for not_an_object in [json!([]), json!("x"), json!(false)] {
        let (kept, errors) = check_defaults(&not_an_object);
        assert!(kept.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("must be an object of settings fields"));
    }
    assert_eq!(check_defaults(&Value::Null), (Map::new(), Vec::new()));
}

#[test]
fn a_client_is_answered_the_defaults_the_engine_kept_and_nothing_else() {
    use super::support::*;
    use sw_agent::protocol::Op;
    use sw_agent::sim::Sim;

    let (kept, refused) = check_defaults(&json!({
        "model": "acme-1",
        "temperature": 5,
        "apiKey": "sk-shipped",
        "modle": "typo",
        "toolUse": false,
    }));
    assert_eq!(refused.len(), 3, "{refused:?}");
    let mut sim = Sim::new(3, agent_policy(), page_tools());
    sim.config.settings_defaults = kept;
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(
        conn,
        Op::SettingsDefaults {
            submission: submission("d1"),
        },
    );
    sim.run(1_000);
    assert_eq!(
        answer(&sim, conn, "d1").unwrap().unwrap(),
        json!({ "defaults": { "model": "acme-1", "toolUse": false } })
    );
    assert!(sim.store.receipts.is_empty(), "a read keeps no receipt");

    // Without any: an empty object.
    let mut sim = Sim::new(4, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(
        conn,
        Op::SettingsDefaults {
            submission: submission("d2"),
        },
    );
    sim.run(1_000);
    assert_eq!(
        answer(&sim, conn, "d2").unwrap().unwrap(),
        json!({ "defaults": {} })
    );
}
