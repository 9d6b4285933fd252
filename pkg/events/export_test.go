package events

// DuplicateFieldByTokens is the tokenizer's answer, the reference
// DuplicateField's fast scan is held to.
var DuplicateFieldByTokens = duplicateFieldByTokens
