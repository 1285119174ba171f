//! The command as an operator runs it: its help, and a bad command line's exit code and usage.
//! (Its commands on each store run in the facade's store tests, against this binary.)

use std::process::Command;

fn tool(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idempotency_keys"))
        .args(args)
        .output()
        .expect("the tool runs");
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn the_help_names_every_command_and_the_exit_codes() {
    let (code, help, _) = tool(&["--help"]);
    assert_eq!(code, Some(0));
    for word in [
        "show",
        "pending",
        "forget",
        "resolve",
        "purge",
        "--store <URL>",
        "EXIT CODES",
    ] {
        assert!(help.contains(word), "the help names {word}: {help}");
    }
    let (code, help, _) = tool(&["pending", "--help"]);
    assert_eq!(code, Some(0));
    assert!(help.contains("--older-than <DURATION>"), "{help}");
}

#[test]
fn a_bad_command_line_exits_2_with_its_reason() {
    for args in [
        &["--store", "sqlite://x", "frobnicate"][..],
        &["purge"],
        &["--store", "sqlite://x", "show", "k"],
        &[
            "--store",
            "sqlite://x",
            "--path",
            "/p",
            "pending",
            "--older-than",
            "5",
        ],
    ] {
        let (code, _, said) = tool(args);
        assert_eq!(code, Some(2), "{args:?}: {said}");
        assert!(said.starts_with("error: "), "{args:?}: {said}");
        assert!(
            said.contains("--help"),
            "points to the help: {args:?}: {said}"
        );
    }
}

#[test]
fn a_url_of_no_store_is_a_bad_command_line() {
    let (code, _, said) = tool(&["--store", "mongodb://x", "purge"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("mongodb://x"), "{said}");
}
