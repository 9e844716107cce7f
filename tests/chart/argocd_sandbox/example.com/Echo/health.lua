-- The object's text, as Argo CD hands it to a script, back as the message.
return {status = obj.spec.status, message = obj.spec.text .. obj.spec.list[2] .. obj.spec.count}
