fn main() {
    // Generates $OUT_DIR/grammar.rs from src/grammar.lalrpop (the only grammar
    // in src/); lalrpop emits the rerun-if-changed directives itself.
    lalrpop::process_src().expect("src/grammar.lalrpop should be a valid lalrpop grammar");
}
