use super::*;

#[test]
fn the_resource_metadata_is_where_the_challenge_says_else_at_the_well_known_addresses() {
    let header = r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp""#;
    assert_eq!(
        resource_metadata_urls(Some(header), "https://mcp.example.com/mcp"),
        ["https://mcp.example.com/.well-known/oauth-protected-resource/mcp"]
    );
    // Unquoted, other case, first parameter.
    assert_eq!(
        resource_metadata_urls(
            Some("Bearer Resource_Metadata=https://a.example/m"),
            "https://x.example/mcp"
        ),
        ["https://a.example/m"]
    );
    // A parameter whose name only ends like it is not it; without one,
    // the address with the server's path, then the origin's root.
    let well_known = [
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
        "https://mcp.example.com/.well-known/oauth-protected-resource",
    ];
    assert_eq!(
        resource_metadata_urls(
            Some(r#"Bearer x_resource_metadata="https://evil.example/""#),
            "https://mcp.example.com/mcp/"
        ),
        well_known
    );
    assert_eq!(
        resource_metadata_urls(None, "https://mcp.example.com/mcp?x=1"),
        well_known
    );
    assert_eq!(
        resource_metadata_urls(None, "http://127.0.0.1:9000"),
        ["http://127.0.0.1:9000/.well-known/oauth-protected-resource"]
    );
    assert!(resource_metadata_urls(None, "ftp://x/mcp").is_empty());
    // A challenge naming an insecure or relative address is not followed.
    for named in [
        "http://evil.example/meta",
        "/meta",
        "chrome-extension://x/meta",
    ] {
        let header = format!("Bearer resource_metadata=\"{named}\"");
        assert_eq!(
            resource_metadata_urls(Some(&header), "https://mcp.example.com/mcp"),
            well_known,
            "{named}"
        );
    }
}

#[test]
fn a_sign_in_asks_for_the_challenge_s_scopes_else_every_scope_of_the_metadata() {
    let metadata = ResourceMetadata {
        issuer: "https://auth.example.com".into(),
        scopes: vec!["tools".into(), "admin".into()],
    };
    assert_eq!(metadata.scopes_to_ask(None), ["tools", "admin"]);
    assert_eq!(
        metadata.scopes_to_ask(Some(
            r#"Bearer resource_metadata="https://m/x", scope="tools""#
        )),
        ["tools"]
    );
    // A step-up challenge (RFC 6750 §3.1) names what the token lacks.
    let step_up = r#"Bearer error="insufficient_scope", scope="tools  files:write", resource_metadata="https://m/x""#;
    assert!(is_insufficient_scope(step_up));
    assert_eq!(
        metadata.scopes_to_ask(Some(step_up)),
        ["tools", "files:write"]
    );
    assert!(!is_insufficient_scope(r#"Bearer error="invalid_token""#));
    // Only scope tokens (RFC 6749 §3.3), at most 20 of at most 100 bytes.
    assert_eq!(
        challenge_scopes(Some("Bearer scope=\"a\\\"b ok \u{e9}t\u{e9} c\"")),
        Some(vec!["ok".to_string(), "c".to_string()])
    );
    let many = format!(
        "Bearer scope=\"{} {}\"",
        "x".repeat(101),
        (0..30)
            .map(|i| format!("s{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let taken = challenge_scopes(Some(&many)).unwrap();
    assert_eq!(taken.len(), MAX_CHALLENGE_SCOPES);
    assert_eq!(taken[0], "s0");
    assert!(!is_insufficient_scope(
        r#"Bearer scope="insufficient_scope""#
    ));
    // An empty scope is no scope: the metadata's.
    assert_eq!(
        metadata.scopes_to_ask(Some(r#"Bearer scope="""#)),
        ["tools", "admin"]
    );
    assert_eq!(challenge_scopes(None), None);
}

#[test]
fn resource_metadata_must_be_for_this_server_and_name_a_secure_issuer() {
    let url = "https://mcp.example.com/mcp";
    let ok = ResourceMetadata::parse(
        &json!({ "resource": url, "authorization_servers": ["https://auth.example.com"], "scopes_supported": ["tools", "bad scope", ""] }),
        url,
    )
    .unwrap();
    assert_eq!(ok.issuer, "https://auth.example.com");
    assert_eq!(ok.scopes, ["tools"]);
    // Metadata at the origin's root names the origin (RFC 9728 §3.3); a
    // resource above the server on its origin covers it, nothing else.
    for resource in [
        "https://mcp.example.com",
        "https://mcp.example.com/",
        "https://MCP.example.com/mcp/",
    ] {
        let doc =
            json!({ "resource": resource, "authorization_servers": ["https://auth.example.com"] });
        assert!(ResourceMetadata::parse(&doc, url).is_ok(), "{resource}");
    }
    for resource in [
        "https://mcp.example.com/mc",
        "https://mcp.example.com/mcp/v2",
        "https://mcp.example.com.evil/",
        "http://mcp.example.com/mcp",
        "https://mcp.example.com:444/mcp",
        "",
    ] {
        let doc =
            json!({ "resource": resource, "authorization_servers": ["https://auth.example.com"] });
        assert!(ResourceMetadata::parse(&doc, url).is_err(), "{resource}");
    }
    let other = ResourceMetadata::parse(
        &json!({ "resource": "https://other.example/mcp", "authorization_servers": ["https://auth.example.com"] }),
        url,
    );
    assert!(matches!(other, Err(OAuthError::Discovery(why)) if why.contains("other.example")));
    assert!(matches!(
        ResourceMetadata::parse(&json!({ "authorization_servers": [] }), url),
        Err(OAuthError::Discovery(_))
    ));
    assert_eq!(
        ResourceMetadata::parse(
            &json!({ "authorization_servers": ["http://auth.example.com"] }),
            url
        ),
        Err(OAuthError::Insecure("http://auth.example.com".into()))
    );
    assert!(is_secure_url("http://127.0.0.1:8080/token"));
    assert!(is_secure_url("http://localhost/token"));
    assert!(is_secure_url("http://[::1]:80/token"));
    assert!(!is_secure_url("http://127.0.0.1.evil.example/token"));
    assert!(!is_secure_url("http://user@evil.example/token"));
    assert!(!is_secure_url("javascript:alert(1)"));
    // The browser ends the host at a backslash: this one goes to
    // evil.example over http, whatever follows the @.
    assert!(!is_secure_url("http://evil.example\\@localhost/token"));
    assert!(!is_secure_url("https://auth.example.com/to ken"));
    assert!(!is_secure_url("https://auth.example.com/\u{7}"));
    assert!(
        !is_secure_url("http://mcp.example.com/mcp"),
        "a remote server over http gets no token"
    );
}

#[test]
fn the_authorization_server_must_be_the_issuer_asked_for_offer_s256_and_secure_endpoints() {
    assert_eq!(
        auth_server_metadata_urls("https://auth.example.com"),
        [
            "https://auth.example.com/.well-known/oauth-authorization-server",
            "https://auth.example.com/.well-known/openid-configuration"
        ]
    );
    assert_eq!(
        auth_server_metadata_urls("https://auth.example.com/tenant1/"),
        [
            "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
            "https://auth.example.com/.well-known/openid-configuration/tenant1",
            "https://auth.example.com/tenant1/.well-known/openid-configuration"
        ]
    );
    let issuer = "https://auth.example.com";
    let good = json!({
        "issuer": issuer,
        "authorization_endpoint": "https://auth.example.com/authorize",
        "token_endpoint": "https://auth.example.com/token",
        "registration_endpoint": "https://auth.example.com/register",
        "code_challenge_methods_supported": ["plain", "S256"],
    });
    let server = AuthServer::parse(&good, issuer).unwrap();
    assert_eq!(
        server.registration_endpoint.as_deref(),
        Some("https://auth.example.com/register")
    );
    assert!(!server.names_issuer);
    // The issuer as the metadata spells it (RFC 9207 compares with it).
    let mut slash = good.clone();
    slash["issuer"] = json!("https://auth.example.com/");
    slash["authorization_response_iss_parameter_supported"] = json!(true);
    let slashed = AuthServer::parse(&slash, issuer).unwrap();
    assert_eq!(slashed.issuer, "https://auth.example.com/");
    assert!(slashed.names_issuer);
    let mut wrong = good.clone();
    wrong["issuer"] = json!("https://evil.example");
    assert!(matches!(
        AuthServer::parse(&wrong, issuer),
        Err(OAuthError::Discovery(_))
    ));
    let mut plain = good.clone();
    plain["code_challenge_methods_supported"] = json!(["plain"]);
    assert!(
        matches!(AuthServer::parse(&plain, issuer), Err(OAuthError::Discovery(why)) if why.contains("S256"))
    );
    let mut not_a_list = good.clone();
    not_a_list["code_challenge_methods_supported"] = json!("S256");
    assert!(
        matches!(AuthServer::parse(&not_a_list, issuer), Err(OAuthError::Discovery(why)) if why.contains("S256"))
    );
    let mut insecure = good.clone();
    insecure["token_endpoint"] = json!("http://auth.example.com/token");
    assert_eq!(
        AuthServer::parse(&insecure, issuer),
        Err(OAuthError::Insecure("http://auth.example.com/token".into()))
    );
    let mut missing = good;
    missing.as_object_mut().unwrap().remove("token_endpoint");
    assert!(
        matches!(AuthServer::parse(&missing, issuer), Err(OAuthError::Discovery(why)) if why.contains("token_endpoint"))
    );
}

#[test]
fn metadata_that_lists_no_pkce_methods_is_refused_whether_oauth_or_openid() {
    // MCP authorization (2025-11-25): absent, PKCE support cannot be
    // confirmed and the client must not go on. OpenID Connect discovery
    // (the fallback address) does not define the field; MCP asks for it
    // there too.
    let issuer = "https://auth.example.com";
    let oauth = json!({
        "issuer": issuer,
        "authorization_endpoint": "https://auth.example.com/authorize",
        "token_endpoint": "https://auth.example.com/token",
        "registration_endpoint": "https://auth.example.com/register",
    });
    let mut openid = oauth.clone();
    openid["jwks_uri"] = json!("https://auth.example.com/jwks");
    openid["subject_types_supported"] = json!(["public"]);
    openid["id_token_signing_alg_values_supported"] = json!(["RS256"]);
    for metadata in [oauth, openid] {
        let refused = AuthServer::parse(&metadata, issuer).unwrap_err();
        let OAuthError::Discovery(why) = &refused else {
            panic!("{refused:?}");
        };
        assert!(why.contains("code_challenge_methods_supported"), "{why}");
        assert!(why.contains("PKCE"), "{why}");
        let said = refused.describe("docs");
        assert!(said.contains("\"docs\""), "{said}");
        assert!(said.contains("PKCE cannot be confirmed"), "{said}");
        // Listed (null is no list), it is checked as ever.
        let mut null = metadata.clone();
        null["code_challenge_methods_supported"] = Value::Null;
        assert!(matches!(
            AuthServer::parse(&null, issuer),
            Err(OAuthError::Discovery(_))
        ));
        let mut listed = metadata;
        listed["code_challenge_methods_supported"] = json!(["S256"]);
        assert!(AuthServer::parse(&listed, issuer).is_ok());
    }
}

#[test]
fn pkce_matches_rfc_7636_appendix_b_and_base64url_has_no_padding() {
    // RFC 7636 appendix B's verifier bytes and challenge.
    let random: [u8; 32] = [
        116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186, 22, 212, 37,
        77, 105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121,
    ];
    let (verifier, challenge) = pkce(&random);
    assert_eq!(verifier, "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk");
    assert_eq!(challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    assert_eq!(base64url(b""), "");
    assert_eq!(base64url(b"f"), "Zg");
    assert_eq!(base64url(b"fo"), "Zm8");
    assert_eq!(base64url(b"foo"), "Zm9v");
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

#[test]
fn the_authorization_address_carries_every_parameter_encoded_and_the_code_comes_back_only_with_its_state(
) {
    let scopes = vec!["tools".to_string(), "read".to_string()];
    let url = Authorization {
        endpoint: "https://auth.example.com/authorize?tenant=a b",
        client_id: "client 1",
        redirect_uri: "https://abc.chromiumapp.org/mcp",
        challenge: "E9Mel",
        state: "s&t",
        resource: "https://mcp.example.com/mcp",
        scopes: &scopes,
    }
    .url();
    assert_eq!(
        url,
        "https://auth.example.com/authorize?tenant=a b&response_type=code&client_id=client%201\
         &redirect_uri=https%3A%2F%2Fabc.chromiumapp.org%2Fmcp&code_challenge=E9Mel\
         &code_challenge_method=S256&state=s%26t&resource=https%3A%2F%2Fmcp.example.com%2Fmcp\
         &scope=tools%20read"
    );
    let server = AuthServer {
        issuer: "https://auth.example.com".into(),
        authorization_endpoint: "https://auth.example.com/authorize".into(),
        token_endpoint: "https://auth.example.com/token".into(),
        registration_endpoint: None,
        takes_client_metadata: false,
        names_issuer: false,
    };
    let back = "https://abc.chromiumapp.org/mcp?code=a%2Fb+c&state=s%26t#frag";
    assert_eq!(code_from_redirect(back, "s&t", &server).unwrap(), "a/b c");
    assert_eq!(
        code_from_redirect(
            "https://abc.chromiumapp.org/mcp?code=x&state=other",
            "s",
            &server
        ),
        Err(OAuthError::StateMismatch)
    );
    assert_eq!(
        code_from_redirect("https://abc.chromiumapp.org/mcp?code=x", "s", &server),
        Err(OAuthError::StateMismatch)
    );
    assert_eq!(
        code_from_redirect(
            "https://abc.chromiumapp.org/mcp?error=access_denied&error_description=The%20user%20said%20no&state=s",
            "s",
            &server
        ),
        Err(OAuthError::Denied("access_denied: The user said no".into()))
    );
    assert!(matches!(
        code_from_redirect(
            "https://abc.chromiumapp.org/mcp?state=s&code=",
            "s",
            &server
        ),
        Err(OAuthError::Denied(_))
    ));
    // A stray % is kept as it is.
    assert_eq!(
        code_from_redirect("https://x/?code=100%&state=s", "s", &server).unwrap(),
        "100%"
    );
    // RFC 9207: an `iss` must be the issuer's, and is required where the
    // issuer says it always sends one.
    let from = |iss: &str| format!("https://x/?code=c&state=s&iss={}", percent_encode(iss));
    assert_eq!(
        code_from_redirect(&from("https://auth.example.com"), "s", &server).unwrap(),
        "c"
    );
    assert!(matches!(
        code_from_redirect(&from("https://evil.example"), "s", &server),
        Err(OAuthError::IssuerMismatch(why)) if why.contains("evil.example")
    ));
    assert!(matches!(
        code_from_redirect(&from("https://auth.example.com/"), "s", &server),
        Err(OAuthError::IssuerMismatch(_))
    ));
    let names = AuthServer {
        names_issuer: true,
        ..server.clone()
    };
    assert!(matches!(
        code_from_redirect("https://x/?code=c&state=s", "s", &names),
        Err(OAuthError::IssuerMismatch(_))
    ));
    assert_eq!(
        code_from_redirect(&from("https://auth.example.com"), "s", &names).unwrap(),
        "c"
    );
    // A refusal from another issuer is a mix-up too, not a refusal.
    assert!(matches!(
        code_from_redirect(
            "https://x/?error=access_denied&state=s&iss=https%3A%2F%2Fevil",
            "s",
            &server
        ),
        Err(OAuthError::IssuerMismatch(_))
    ));
}

#[test]
fn token_answers_become_grants_kept_per_server_and_renewed_with_their_refresh_token() {
    let url = "https://mcp.example.com/mcp";
    let token = "https://auth.example.com/token";
    let grant = Grant::from_tokens(
        &json!({ "access_token": "at1", "token_type": "bearer", "expires_in": 3600, "refresh_token": "rt1" }),
        1_000,
        url,
        token,
        "client-1",
        None,
    )
    .unwrap();
    assert_eq!(grant.expires_at, Some(3_601_000));
    assert!(!grant.expiring(1_000));
    assert!(grant.expiring(3_601_000 - EXPIRY_MARGIN_MS));
    assert_eq!(
        refresh_request(&grant).unwrap(),
        "grant_type=refresh_token&refresh_token=rt1&client_id=client-1&resource=https%3A%2F%2Fmcp.example.com%2Fmcp"
    );
    // A renewal without a new refresh token keeps the old one.
    let renewed = Grant::from_tokens(
        &json!({ "access_token": "at2", "token_type": "Bearer" }),
        2_000,
        url,
        token,
        "client-1",
        Some(&grant),
    )
    .unwrap();
    assert_eq!(renewed.refresh_token.as_deref(), Some("rt1"));
    assert_eq!(renewed.expires_at, None);
    // Kept and read back; a grant for another address is not this server's.
    assert_eq!(Grant::from_json(&grant.to_json(), url), Some(grant.clone()));
    assert_eq!(
        Grant::from_json(&grant.to_json(), "https://other.example/mcp"),
        None
    );
    assert_eq!(Grant::from_json(&json!({ "serverUrl": url }), url), None);
    assert_eq!(grant_key(url), "mcpGrant:https://mcp.example.com/mcp");
    // Refusals.
    assert!(matches!(
        Grant::from_tokens(&json!({ "access_token": "x", "token_type": "mac" }), 0, url, token, "c", None),
        Err(OAuthError::Token(why)) if why.contains("mac")
    ));
    assert!(matches!(
        Grant::from_tokens(&json!({ "token_type": "Bearer" }), 0, url, token, "c", None),
        Err(OAuthError::Token(_))
    ));
    assert_eq!(
        token_error(
            400,
            r#"{"error":"invalid_grant","error_description":"The code was used."}"#
        ),
        OAuthError::Token("HTTP 400, invalid_grant: The code was used.".into())
    );
    assert_eq!(
        token_error(502, "<html>"),
        OAuthError::Token("HTTP 502".into())
    );
    assert_eq!(
        code_request("c/1", "v", "client-1", "https://abc.chromiumapp.org/mcp", url),
        "grant_type=authorization_code&code=c%2F1&redirect_uri=https%3A%2F%2Fabc.chromiumapp.org%2Fmcp&client_id=client-1&code_verifier=v&resource=https%3A%2F%2Fmcp.example.com%2Fmcp"
    );
    let registration: Value =
        serde_json::from_str(&registration_body("https://abc.chromiumapp.org/mcp")).unwrap();
    assert_eq!(registration["token_endpoint_auth_method"], "none");
    assert_eq!(
        registration["redirect_uris"][0],
        "https://abc.chromiumapp.org/mcp"
    );
    assert_eq!(client_id(&json!({ "client_id": "c-9" })).unwrap(), "c-9");
    assert!(matches!(
        client_id(&json!({ "client_id": "" })),
        Err(OAuthError::Registration(_))
    ));
    let said = OAuthError::NoRegistration {
        redirect: "https://abc.chromiumapp.org/mcp-sign-in".into(),
        metadata_url_refused: false,
    }
    .describe("docs");
    assert!(
        said.starts_with("Signing in to the MCP server \"docs\" failed: "),
        "{said}"
    );
    assert!(said.contains("oauth.clientId"), "{said}");
    assert!(
        said.contains("https://abc.chromiumapp.org/mcp-sign-in"),
        "{said}"
    );
}

#[test]
fn a_server_entry_s_client_settings_are_checked() {
    let parse = |v: Value| ClientConfig::parse(Some(&v));
    assert_eq!(ClientConfig::parse(None).unwrap(), ClientConfig::default());
    assert!(!ClientConfig::parse(Some(&Value::Null)).unwrap().is_set());
    let given = parse(json!({ "clientId": "ext-client 7" })).unwrap();
    assert_eq!(given.client_id.as_deref(), Some("ext-client 7"));
    assert!(given.is_set());
    let document =
        parse(json!({ "clientMetadataUrl": "https://ext.example.com/oauth/client.json" })).unwrap();
    assert_eq!(
        document.metadata_url.as_deref(),
        Some("https://ext.example.com/oauth/client.json")
    );
    // http only on this machine, like every sign-in address.
    assert!(parse(json!({ "clientMetadataUrl": "http://127.0.0.1:9/client.json" })).is_ok());
    let refused = |v: Value, says: &str| {
        let why = parse(v.clone()).unwrap_err();
        assert!(why.contains(says), "{v}: {why}");
    };
    refused(json!("ext-client"), "must be an object");
    refused(
        json!({ "clientSecret": "s" }),
        "unknown field `oauth.clientSecret`",
    );
    refused(json!({ "clientId": 7 }), "`oauth.clientId` must be text");
    refused(json!({ "clientId": "" }), "1-255 visible ASCII");
    refused(json!({ "clientId": " padded" }), "1-255 visible ASCII");
    refused(json!({ "clientId": "caf\u{e9}" }), "1-255 visible ASCII");
    refused(json!({ "clientId": "a\nb" }), "1-255 visible ASCII");
    refused(
        json!({ "clientId": "x".repeat(256) }),
        "1-255 visible ASCII",
    );
    let url = |u: &str, says: &str| refused(json!({ "clientMetadataUrl": u }), says);
    url("http://ext.example.com/client.json", "https address");
    url("ftp://ext.example.com/client.json", "https address");
    url("https://ext.example.com", "must have a path");
    url("https://ext.example.com/", "must have a path");
    url(
        "https://ext.example.com/a/../client.json",
        "`..` or empty segments",
    );
    url(
        "https://ext.example.com/./client.json",
        "`..` or empty segments",
    );
    url(
        "https://ext.example.com/a/%2E%2e/client.json",
        "`..` or empty segments",
    );
    url(
        "https://ext.example.com/%2e/client.json",
        "`..` or empty segments",
    );
    url("https://ext.example.com//", "`..` or empty segments");
    url(
        "https://ext.example.com/a//client.json",
        "`..` or empty segments",
    );
    url("https://ext.example.com/client.json#x", "fragment");
    url("https://me@ext.example.com/client.json", "user name");
    url(
        &format!("https://ext.example.com/{}", "x".repeat(250)),
        "too long",
    );
}

#[test]
fn the_client_is_the_given_one_then_a_document_the_server_takes_then_a_registered_one() {
    let redirect = "https://abc.chromiumapp.org/mcp-sign-in";
    let registers = AuthServer {
        issuer: "https://auth.example.com".into(),
        authorization_endpoint: "https://auth.example.com/authorize".into(),
        token_endpoint: "https://auth.example.com/token".into(),
        registration_endpoint: Some("https://auth.example.com/register".into()),
        takes_client_metadata: false,
        names_issuer: false,
    };
    let takes_documents = AuthServer {
        takes_client_metadata: true,
        ..registers.clone()
    };
    let neither = AuthServer {
        registration_endpoint: None,
        ..registers.clone()
    };
    let nothing = ClientConfig::default();
    let given = ClientConfig {
        client_id: Some("ext-1".into()),
        metadata_url: Some("https://ext.example.com/client.json".into()),
    };
    let document = ClientConfig {
        client_id: None,
        metadata_url: Some("https://ext.example.com/client.json".into()),
    };
    assert_eq!(
        choose_client(&nothing, &registers, redirect),
        Ok(ClientChoice::Register("https://auth.example.com/register"))
    );
    // A given id wins over everything, even where the server registers.
    for server in [&registers, &takes_documents, &neither] {
        assert_eq!(
            choose_client(&given, server, redirect),
            Ok(ClientChoice::Given("ext-1"))
        );
    }
    assert_eq!(
        choose_client(&document, &takes_documents, redirect),
        Ok(ClientChoice::MetadataDocument(
            "https://ext.example.com/client.json"
        ))
    );
    // A server that reads no documents: registered, or none at all.
    assert_eq!(
        choose_client(&document, &registers, redirect),
        Ok(ClientChoice::Register("https://auth.example.com/register"))
    );
    assert_eq!(
        choose_client(&document, &neither, redirect),
        Err(OAuthError::NoRegistration {
            redirect: redirect.into(),
            metadata_url_refused: true
        })
    );
    let said = choose_client(&nothing, &neither, redirect)
        .unwrap_err()
        .describe("docs");
    assert!(!said.contains("metadata document"), "{said}");
    // The metadata says whether the server reads documents.
    let metadata = json!({
        "issuer": "https://auth.example.com",
        "authorization_endpoint": "https://auth.example.com/authorize",
        "token_endpoint": "https://auth.example.com/token",
        "code_challenge_methods_supported": ["S256"],
        "client_id_metadata_document_supported": true,
    });
    let parsed = AuthServer::parse(&metadata, "https://auth.example.com").unwrap();
    assert!(parsed.takes_client_metadata);
    assert_eq!(parsed.registration_endpoint, None);
    // What the user is told when the server refused each kind.
    assert!(ClientChoice::Given("ext-1")
        .refused_note()
        .contains("\"ext-1\""));
    assert!(
        ClientChoice::MetadataDocument("https://ext.example.com/client.json")
            .refused_note()
            .contains("https://ext.example.com/client.json")
    );
    assert!(ClientChoice::Register("https://auth.example.com/register")
        .refused_note()
        .contains("register a new one"));
}

#[test]
fn a_registered_client_is_kept_for_its_redirect_and_forgotten_when_the_server_disowns_it() {
    let client = KeptClient {
        client_id: "client-7".into(),
        redirect_uri: "https://abc.chromiumapp.org/mcp-sign-in".into(),
    };
    assert_eq!(
        client_key("https://auth.example.com/token"),
        "mcpClient:https://auth.example.com/token"
    );
    let kept = client.to_json();
    assert_eq!(
        KeptClient::from_json(&kept, "https://abc.chromiumapp.org/mcp-sign-in"),
        Some(client.clone())
    );
    // Registered for another extension id's redirect: not this one's.
    assert_eq!(
        KeptClient::from_json(&kept, "https://xyz.chromiumapp.org/mcp-sign-in"),
        None
    );
    assert_eq!(
        KeptClient::from_json(&json!({ "clientId": "" , "redirectUri": "x" }), "x"),
        None
    );
    assert_eq!(KeptClient::from_json(&Value::Null, "x"), None);
    // What says the server does not know the client, and what does not.
    assert!(token_error(401, r#"{"error":"invalid_client"}"#).blames_client());
    assert!(OAuthError::Denied("unauthorized_client: unknown".into()).blames_client());
    assert!(!OAuthError::Denied("access_denied".into()).blames_client());
    assert!(!token_error(
        400,
        r#"{"error":"invalid_grant","error_description":"not an invalid_client_x"}"#
    )
    .blames_client());
    assert!(!OAuthError::Registration("invalid_client".into()).blames_client());
    // Chrome's words for a sign-in page that could not be shown, not for a
    // window the user closed.
    assert!(
        OAuthError::WindowClosed("Authorization page could not be loaded.".into()).page_not_shown()
    );
    assert!(!OAuthError::WindowClosed("The user did not approve access.".into()).page_not_shown());
    assert_eq!(
        OAuthError::WindowClosed("Authorization page could not be loaded.".into())
            .with_note("sign in again")
            .describe("docs"),
        "Signing in to the MCP server \"docs\" failed: the sign-in did not complete (Authorization page could not be loaded; sign in again)."
    );
}

#[test]
fn grants_of_addresses_no_server_uses_are_the_ones_forgotten() {
    let keys: Vec<String> = [
        "settings",
        "mcpCatalog",
        "mcpGrant:https://kept.example/mcp",
        "mcpGrant:https://dropped.example/mcp",
        "mcpClient:https://auth.example/token",
        "mcpGrant:https://kept.example/mcp/other",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    assert_eq!(
        orphan_grant_keys(&keys, &["https://kept.example/mcp"]),
        [
            "mcpGrant:https://dropped.example/mcp",
            "mcpGrant:https://kept.example/mcp/other"
        ]
    );
    assert!(orphan_grant_keys(&keys[..2], &[]).is_empty());
}
