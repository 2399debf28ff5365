package wire

import (
	"strconv"
	"strings"
)

// Row keys (docs/contract.md §2.4, §7). A store keeps one row per send of a
// message, and one message id may have several sends pending at once (a
// retry that reuses the id, taken in while the earlier send is being
// forwarded). The first send pending under an id is stored under the id
// itself; a later one, while that key is taken, under the id, SendSep and
// its send number (2, 3, ...). SendSep is a control character, which no
// message id holds (ValidateID), so a key names exactly one id and one
// send, and the keys of an id are the id and those starting with id+SendSep.
// Keys travel in dispatcher tokens and in the store; users see the id and
// the number apart (the admin API's "send").
const SendSep = "\x1f"

// maxSend bounds the send number of a key: far more sends of one id than
// can be pending at once, and few enough digits that a key stays short.
const maxSend = 1 << 20

// SendKey is the row key of send n of id: id itself for n ≤ 1.
func SendKey(id string, n int) string {
	if n <= 1 {
		return id
	}
	return id + SendSep + strconv.Itoa(n)
}

// SplitKey returns the message id and the send number (1 for the id
// itself) of a row key. A key with no valid send number is all id.
func SplitKey(key string) (id string, n int) {
	i := strings.Index(key, SendSep)
	if i < 0 {
		return key, 1
	}
	n, err := strconv.Atoi(key[i+len(SendSep):])
	if err != nil || n < 2 || n > maxSend || strconv.Itoa(n) != key[i+len(SendSep):] {
		return key, 1
	}
	return key[:i], n
}

// KeyID is the message id of a row key.
func KeyID(key string) string {
	id, _ := SplitKey(key)
	return id
}

// IsKeyOf reports whether key is a row key of message id.
func IsKeyOf(key, id string) bool {
	return key == id || (strings.HasPrefix(key, id+SendSep) && KeyID(key) == id)
}

// ValidateKey reports why key cannot be a row key, or nil: its id must be
// valid (ValidateID) and its send number, when it has one, 2 to maxSend in
// plain decimal.
func ValidateKey(what, key string) error {
	id, n := SplitKey(key)
	if n == 1 && strings.Contains(key, SendSep) {
		return &invalidName{ErrInvalidID, what + " has an invalid send number"}
	}
	return ValidateID(what, id)
}
